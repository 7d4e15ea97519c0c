mod boot;
mod support;
mod workspace;
