mod boot;
mod check;
mod coordinator;
mod image;
mod support;
mod workspace;
