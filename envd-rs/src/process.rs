//! The Connect service process: TO BE PORTED from envd/internal/process.

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
    connect::unary_error(&Error::new(Code::Unimplemented, format!("process.{rpc} is not implemented")))
}

/// warm does the start-up work no first request needs, after the first
/// answer: the commands' cgroups.
pub async fn warm(_st: &Arc<State>) {}
