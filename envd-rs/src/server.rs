//! envd's HTTP surface: CORS, the access token, and the routes to the
//! services (envd/server.go).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hyper::Method;
use serde::Deserialize;

use crate::http::{self, Request, Response};
use crate::state::State;
use crate::{connect, files, filesystem, metrics, process, tunnel, user};

const MAX_INIT_BODY: usize = 1 << 20;
const ACCESS_TOKEN_HEADER: &str = "x-access-token";

/// handle serves one request.
pub async fn handle(st: Arc<State>, req: Request) -> Response {
    let origin = req.headers().contains_key(hyper::header::ORIGIN);
    let mut resp = if req.method() == Method::OPTIONS && req.headers().contains_key("access-control-request-method") {
        let r = preflight(&req);
        http::unread(req, r).await
    } else if let Some(denied) = authorize(&st, &req) {
        http::unread(req, denied).await
    } else if req.method() == Method::CONNECT {
        // A CONNECT has an authority, not a path: the tunnel takes it.
        tunnel::handle(st.clone(), req).await
    } else {
        route(&st, req).await
    };
    if origin {
        let h = resp.headers_mut();
        h.insert("access-control-allow-origin", "*".parse().unwrap());
        h.insert(
            "access-control-expose-headers",
            "Connect-Protocol-Version, Grpc-Status, Grpc-Message, Content-Encoding, Content-Disposition, Content-Length"
                .parse()
                .unwrap(),
        );
    }
    warm(&st);
    resp
}

static WARMED: AtomicBool = AtomicBool::new(false);

/// warm starts the start-up work no first request needs (commands'
/// cgroups) once the first answer is out: until then it would share the
/// sandbox's CPUs with sandboxd's readiness probe, which every create
/// waits for.
pub fn warm(st: &Arc<State>) {
    if !WARMED.swap(true, Ordering::SeqCst) {
        let st = st.clone();
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            process::warm(&st).await;
        });
    }
}

async fn route(st: &Arc<State>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    let m = req.method().clone();
    if let Some(rpc) = path.strip_prefix("/process.Process/") {
        if m != Method::POST {
            return http::unread(req, http::status(405)).await;
        }
        return process::handle(st.clone(), rpc.to_string(), req).await;
    }
    if let Some(rpc) = path.strip_prefix("/filesystem.Filesystem/") {
        if m != Method::POST {
            return http::unread(req, http::status(405)).await;
        }
        return filesystem::handle(st.clone(), rpc.to_string(), req).await;
    }
    match (path.as_str(), &m) {
        ("/files", _) => files::handle(st.clone(), req).await,
        ("/health", &Method::GET) | ("/health", &Method::HEAD) => {
            let mut r = http::status(204);
            r.headers_mut().insert("cache-control", "no-store".parse().unwrap());
            r
        }
        ("/init", &Method::POST) => init(st, req).await,
        ("/envs", &Method::GET) => http::json(200, &st.defaults().envs),
        ("/metrics", &Method::GET) => metrics::handle(st.clone(), req).await,
        ("/logs", &Method::GET) => logs(st, &req),
        ("/health" | "/init" | "/envs" | "/metrics" | "/logs", _) => http::unread(req, http::status(405)).await,
        _ => {
            http::unread(
                req,
                http::bytes(404, "text/plain; charset=utf-8", "404 page not found\n"),
            )
            .await
        }
    }
}

/// authorize enforces the access token once /init has set one. /health
/// stays open for liveness probes; /files checks the token or a URL
/// signature itself; /init checks it itself (the first /init sets it).
fn authorize(st: &State, req: &Request) -> Option<Response> {
    let p = req.uri().path();
    let exempt = (req.method() == Method::GET && p == "/health")
        || p == "/files"
        || (req.method() == Method::POST && p == "/init");
    let given = req
        .headers()
        .get(ACCESS_TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !exempt && st.token_is_set() && !st.token_equal(given) {
        log!(st.log, Warn, "request without a valid access token", "method" => req.method(), "path" => p);
        return Some(http::error_json(
            401,
            "unauthorized access, please provide a valid access token or method signing if supported",
        ));
    }
    None
}

fn preflight(req: &Request) -> Response {
    let mut r = http::status(204);
    let h = r.headers_mut();
    h.insert(
        "access-control-allow-methods",
        "HEAD, GET, POST, PUT, PATCH, DELETE".parse().unwrap(),
    );
    let asked = req.headers().get("access-control-request-headers").cloned();
    h.insert(
        "access-control-allow-headers",
        asked.unwrap_or_else(|| "*".parse().unwrap()),
    );
    h.insert("access-control-max-age", "7200".parse().unwrap());
    r
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct InitRequest {
    env_vars: Option<BTreeMap<String, String>>,
    access_token: Option<String>,
    default_user: Option<String>,
    default_workdir: Option<String>,
    #[allow(dead_code)]
    timestamp: Option<serde_json::Value>, // a container shares the host's clock
}

async fn init(st: &Arc<State>, req: Request) -> Response {
    let (parts, mut body) = req.into_parts();
    let body = match connect::read_limited(&mut body, MAX_INIT_BODY).await {
        Ok(b) => b,
        Err(e) if e.code == crate::error::Code::ResourceExhausted => {
            return http::finish_unread(&parts, &mut body, http::error_json(413, "init body too large")).await;
        }
        Err(e) => return http::error_json(400, &format!("read body: {}", e.message)),
    };
    let mut r = InitRequest::default();
    if !body.is_empty() {
        match serde_json::from_slice::<InitRequest>(&body) {
            Ok(v) => r = v,
            Err(e) => return http::error_json(400, &format!("invalid init body: {e}")),
        }
    }
    if st.token_is_set() {
        let header = connect::header(&parts, ACCESS_TOKEN_HEADER);
        let body_token = r.access_token.as_deref().unwrap_or("");
        if !st.token_equal(header) && !st.token_equal(body_token) {
            return http::error_json(401, "access token reset not authorized");
        }
    }
    let (envs, default_user) = (r.env_vars.unwrap_or_default(), r.default_user.unwrap_or_default());
    if !default_user.is_empty() && default_user != st.defaults().user {
        if let Err(e) = user::lookup(&default_user) {
            return http::error_json(400, &e.message);
        }
    }
    st.merge_defaults(&envs, &default_user, r.default_workdir.as_deref().unwrap_or(""));
    if let Some(t) = &r.access_token {
        st.set_token(t);
    }
    let d = st.defaults();
    log!(st.log, Info, "initialised",
        "env_vars" => envs.keys().cloned().collect::<Vec<_>>().join(","),
        "default_user" => d.user,
        "workdir" => d.workdir,
        "access_token_set" => r.access_token.as_deref().is_some_and(|t| !t.is_empty()));
    http::status(204)
}

fn logs(st: &State, req: &Request) -> Response {
    let q = req.uri().query();
    let after = match http::query_get(q, "after") {
        Some(v) if !v.is_empty() => match v.parse::<u64>() {
            Ok(n) => n,
            Err(_) => return http::error_json(400, "after: want a sequence number"),
        },
        _ => 0,
    };
    let mut r = http::json(
        200,
        &st.log.after(&http::query_get(q, "boot").unwrap_or_default(), after),
    );
    r.headers_mut().insert("cache-control", "no-store".parse().unwrap());
    r
}
