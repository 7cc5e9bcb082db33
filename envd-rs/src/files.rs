//! GET and POST /files: TO BE PORTED from envd/internal/files.

use std::sync::Arc;

use crate::http::{self, Request, Response};
use crate::state::State;

pub async fn handle(_st: Arc<State>, _req: Request) -> Response {
    http::error_json(501, "/files is not implemented")
}
