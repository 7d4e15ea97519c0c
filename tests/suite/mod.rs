mod boot;
mod coordinator;
mod events;
mod support;
mod workspace;
