//! The messages of process.proto in protojson (envd/api/spec/process).

use std::collections::BTreeMap;

use base64::Engine;
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{invalid, EndInfo, Event, Kind};
use crate::connect::pj;
use crate::error::Error;

/// opt_u32 reads an optional uint32 given as a number or a string.
fn opt_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    match Option::<Value>::deserialize(d)? {
        None => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .map(Some)
            .ok_or_else(|| de::Error::custom("invalid uint32")),
        Some(Value::String(s)) => s.trim().parse::<u32>().map(Some).map_err(de::Error::custom),
        Some(_) => Err(de::Error::custom("invalid uint32")),
    }
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
pub struct Selector {
    #[serde(deserialize_with = "opt_u32")]
    pub pid: Option<u32>,
    pub tag: Option<String>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
pub struct ConfigIn {
    pub cmd: Option<String>,
    pub args: Option<Vec<String>>,
    pub envs: Option<BTreeMap<String, String>>,
    pub cwd: Option<String>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
pub struct SizeIn {
    #[serde(with = "pj::u32s")]
    pub cols: u32,
    #[serde(with = "pj::u32s")]
    pub rows: u32,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
pub struct PtyIn {
    pub size: Option<SizeIn>,
}

impl PtyIn {
    pub fn size(&self) -> (u32, u32) {
        self.size.as_ref().map(|s| (s.cols, s.rows)).unwrap_or((0, 0))
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct StartRequest {
    pub process: Option<ConfigIn>,
    pub pty: Option<PtyIn>,
    pub tag: Option<String>,
    pub stdin: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct ConnectRequest {
    pub process: Option<Selector>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
pub struct InputIn {
    pub stdin: Option<String>,
    pub pty: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct SendInputRequest {
    pub process: Option<Selector>,
    pub input: Option<InputIn>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct StreamStart {
    pub process: Option<Selector>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct StreamData {
    pub input: Option<InputIn>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct StreamInputRequest {
    pub start: Option<StreamStart>,
    pub data: Option<StreamData>,
    pub keepalive: Option<Value>,
}

/// SignalIn is the Signal enum: its name or its number.
#[derive(Default)]
pub struct SignalIn(Value);

impl<'de> Deserialize<'de> for SignalIn {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<SignalIn, D::Error> {
        // protojson: a known name or any number; an unknown name is an error.
        let v = Value::deserialize(d)?;
        match &v {
            Value::String(s) if !matches!(s.as_str(), "SIGNAL_UNSPECIFIED" | "SIGNAL_SIGTERM" | "SIGNAL_SIGKILL") => {
                Err(de::Error::custom(format!("invalid value for enum field signal: {s:?}")))
            }
            Value::Number(n) if n.as_i64().and_then(|n| i32::try_from(n).ok()).is_none() => {
                Err(de::Error::custom(format!("invalid value for enum field signal: {n}")))
            }
            Value::String(_) | Value::Number(_) | Value::Null => Ok(SignalIn(v)),
            _ => Err(de::Error::custom("invalid value for enum field signal")),
        }
    }
}

impl SignalIn {
    pub fn number(&self) -> i64 {
        match &self.0 {
            Value::Number(n) => n.as_i64().unwrap_or(0),
            Value::String(s) => match s.as_str() {
                "SIGNAL_SIGKILL" => 9,
                "SIGNAL_SIGTERM" => 15,
                _ => 0,
            },
            _ => 0,
        }
    }

    /// name is the enum value's name, or its number when it has none.
    pub fn name(&self) -> String {
        match self.number() {
            0 => "SIGNAL_UNSPECIFIED".into(),
            9 => "SIGNAL_SIGKILL".into(),
            15 => "SIGNAL_SIGTERM".into(),
            n => n.to_string(),
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct SendSignalRequest {
    pub process: Option<Selector>,
    pub signal: SignalIn,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct UpdateRequest {
    pub process: Option<Selector>,
    pub pty: Option<PtyIn>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct CloseStdinRequest {
    pub process: Option<Selector>,
}

#[derive(Serialize)]
pub struct Empty {}

#[derive(Serialize, Clone)]
pub struct ConfigOut {
    pub cmd: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub envs: BTreeMap<String, String>,
    pub cwd: String,
}

#[derive(Serialize)]
pub struct ProcessInfo {
    pub config: ConfigOut,
    pub pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

#[derive(Serialize)]
pub struct ListResponse {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<ProcessInfo>,
}

pub fn decode_b64(s: &str) -> Result<Vec<u8>, Error> {
    let t = s.trim_end_matches('=');
    base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(t)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(t))
        .map_err(|e| invalid(format!("input is not base64: {e}")))
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

pub fn start_msg(pid: u32) -> Value {
    json!({"event": {"start": {"pid": pid}}})
}

pub fn keepalive_msg() -> Value {
    json!({"event": {"keepalive": {}}})
}

fn end_json(e: &EndInfo) -> Value {
    let mut m = serde_json::Map::new();
    if e.exit_code != 0 {
        m.insert("exitCode".into(), e.exit_code.into());
    }
    if e.exited {
        m.insert("exited".into(), true.into());
    }
    if !e.status.is_empty() {
        m.insert("status".into(), e.status.clone().into());
    }
    if let Some(err) = &e.error {
        m.insert("error".into(), err.clone().into());
    }
    Value::Object(m)
}

pub fn event_msg(ev: &Event) -> Value {
    match ev {
        Event::Data(k, b) => {
            let key = match k {
                Kind::Stdout => "stdout",
                Kind::Stderr => "stderr",
                Kind::Pty => "pty",
            };
            json!({"event": {"data": {key: b64(b)}}})
        }
        Event::End(e) => json!({"event": {"end": end_json(e)}}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::decode;

    #[test]
    fn requests() {
        let m: StartRequest =
            decode(br#"{"process":{"cmd":"/bin/sh","args":["-c","x"],"envs":{"A":"1"}},"pty":{"size":{"cols":80,"rows":"24"}},"stdin":false}"#).unwrap();
        assert_eq!(m.process.unwrap().cmd.as_deref(), Some("/bin/sh"));
        assert_eq!(m.pty.unwrap().size(), (80, 24));
        assert_eq!(m.stdin, Some(false));
        let s: SendSignalRequest = decode(br#"{"process":{"pid":"12"},"signal":"SIGNAL_SIGKILL"}"#).unwrap();
        assert_eq!(s.process.unwrap().pid, Some(12));
        assert_eq!(s.signal.number(), 9);
        let s: SendSignalRequest = decode(br#"{"process":{"tag":"t"},"signal":15}"#).unwrap();
        assert_eq!(s.signal.name(), "SIGNAL_SIGTERM");
        let s: SendSignalRequest = decode(br#"{}"#).unwrap();
        assert_eq!(s.signal.name(), "SIGNAL_UNSPECIFIED");
        let s: SendSignalRequest = decode(br#"{"signal":5}"#).unwrap();
        assert_eq!(s.signal.name(), "5");
        assert!(decode::<SendSignalRequest>(br#"{"signal":"SIGNAL_SIGHUP"}"#).is_err());
        let i: SendInputRequest = decode(br#"{"input":{"stdin":""}}"#).unwrap();
        assert_eq!(i.input.unwrap().stdin.as_deref(), Some(""));
    }

    #[test]
    fn events() {
        assert_eq!(
            event_msg(&Event::Data(Kind::Stdout, bytes::Bytes::from_static(b"hi"))).to_string(),
            r#"{"event":{"data":{"stdout":"aGk="}}}"#
        );
        let end = EndInfo {
            exit_code: -1,
            exited: false,
            status: "signal: killed".into(),
            error: None,
        };
        assert_eq!(
            event_msg(&Event::End(end)).to_string(),
            r#"{"event":{"end":{"exitCode":-1,"status":"signal: killed"}}}"#
        );
        let ok = EndInfo {
            exit_code: 0,
            exited: true,
            status: "exit status 0".into(),
            error: None,
        };
        assert_eq!(
            event_msg(&Event::End(ok)).to_string(),
            r#"{"event":{"end":{"exited":true,"status":"exit status 0"}}}"#
        );
    }
}
