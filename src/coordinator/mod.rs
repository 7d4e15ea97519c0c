//! The reference coordinator (PROTOCOL.md section 6).
