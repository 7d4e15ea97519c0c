mod boot;
mod coordinator;
mod support;
mod workspace;
