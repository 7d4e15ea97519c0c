mod boot;
mod coordinator;
mod harvest;
mod support;
mod workspace;
