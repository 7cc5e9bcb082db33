//! GET /metrics: TO BE PORTED from envd/metrics.go.

use std::sync::Arc;

use crate::http::{self, Request, Response};
use crate::state::State;

#[derive(Default)]
pub struct Sampler {}

pub async fn handle(_st: Arc<State>, _req: Request) -> Response {
    http::error_json(501, "/metrics is not implemented")
}
