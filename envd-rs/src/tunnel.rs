//! The CONNECT port tunnel: TO BE PORTED from envd/internal/tunnel.

use std::sync::Arc;

use crate::http::{self, Request, Response};
use crate::state::State;

#[derive(Default)]
pub struct Service {}

pub async fn handle(_st: Arc<State>, _req: Request) -> Response {
    http::error_json(501, "the tunnel is not implemented")
}
