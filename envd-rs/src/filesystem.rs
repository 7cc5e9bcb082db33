//! The Connect service filesystem: TO BE PORTED from envd/internal/filesystem.

use std::sync::Arc;

use crate::connect;
use crate::error::{Code, Error};
use crate::http::{Request, Response};
use crate::state::State;

#[derive(Default)]
pub struct Service {}

impl Service {
    /// close ends what the service holds (at envd's shutdown).
    pub fn close(&self) {}
}

/// handle serves one RPC of the service.
pub async fn handle(_st: Arc<State>, rpc: String, _req: Request) -> Response {
    connect::unary_error(&Error::new(Code::Unimplemented, format!("filesystem.{rpc} is not implemented")))
}
