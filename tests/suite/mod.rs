mod boot;
mod check;
mod coordinator;
mod harvest;
mod image;
mod status;
mod support;
mod workspace;
