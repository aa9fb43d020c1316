//! cpnet integration tests live in tests/.
