//! The least agent of ../agent.rs, served by hyper (HTTP/1.1 and h2c on each
//! listener) on tokio's current-thread runtime: the HTTP stack a full agent
//! would use, to see whether it keeps the start near the floor. It answers
//! every request with 204 and serves nothing else; unlike agent.rs it does
//! not reap (no child is ever started). Built by bench/agent-floor.sh.

use std::convert::Infallible;

use http_body_util::Empty;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncRead, AsyncWrite};

#[path = "../../start.rs"]
mod start;

async fn answer(_: Request<Incoming>) -> Result<Response<Empty<Bytes>>, Infallible> {
    let mut r = Response::new(Empty::new());
    *r.status_mut() = hyper::StatusCode::NO_CONTENT;
    Ok(r)
}

fn serve<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(s: S) {
    tokio::spawn(async move {
        let _ = Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(s), service_fn(answer))
            .await;
    });
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    if args.iter().any(|a| a == "--version") {
        println!("agentfloor-hyper");
        return;
    }
    if args.iter().any(|a| a == "--init") {
        start::loopback_up();
    }
    start::check_user(&arg("--default-user").unwrap_or_else(|| "user".into()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        if let Some(path) = arg("--socket") {
            let tmp = format!("{path}.{}.tmp", std::process::id());
            let _ = std::fs::remove_file(&tmp);
            let l = tokio::net::UnixListener::bind(&tmp).expect("socket");
            std::fs::rename(&tmp, &path).expect("rename");
            tokio::spawn(async move {
                while let Ok((c, _)) = l.accept().await {
                    serve(c);
                }
            });
        }
        if let Some(addr) = arg("--listen").filter(|a| !a.is_empty()) {
            let l = tokio::net::TcpListener::bind(&addr).await.expect("listen");
            tokio::spawn(async move {
                while let Ok((c, _)) = l.accept().await {
                    serve(c);
                }
            });
        }
        std::future::pending::<()>().await;
    });
}
