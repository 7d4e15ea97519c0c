mod boot;
mod check;
mod coordinator;
mod image;
mod status;
mod support;
mod workspace;
