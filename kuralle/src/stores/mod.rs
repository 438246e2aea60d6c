//! [`RunStore`](crate::RunStore) implementations.
