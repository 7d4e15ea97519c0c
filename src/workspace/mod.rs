//! The workspace: session files, the clone, the credential helper.
