//! A download's Content-Type as Go's http.ServeContent guesses it: by the
//! name's extension (mime.TypeByExtension: a built-in table, then the
//! system's /etc/mime.types), else by sniffing the first 512 bytes
//! (a subset of http.DetectContentType).

use std::collections::HashMap;
use std::sync::OnceLock;

const BUILTIN: &[(&str, &str)] = &[
    (".avif", "image/avif"),
    (".css", "text/css; charset=utf-8"),
    (".gif", "image/gif"),
    (".htm", "text/html; charset=utf-8"),
    (".html", "text/html; charset=utf-8"),
    (".jpeg", "image/jpeg"),
    (".jpg", "image/jpeg"),
    (".js", "text/javascript; charset=utf-8"),
    (".json", "application/json"),
    (".mjs", "text/javascript; charset=utf-8"),
    (".pdf", "application/pdf"),
    (".png", "image/png"),
    (".svg", "image/svg+xml"),
    (".wasm", "application/wasm"),
    (".webp", "image/webp"),
    (".xml", "text/xml; charset=utf-8"),
];

fn system_types() -> &'static HashMap<String, String> {
    static T: OnceLock<HashMap<String, String>> = OnceLock::new();
    T.get_or_init(|| {
        let mut m = HashMap::new();
        for f in [
            "/etc/mime.types",
            "/etc/apache2/mime.types",
            "/etc/apache/mime.types",
            "/etc/httpd/conf/mime.types",
        ] {
            let Ok(s) = std::fs::read_to_string(f) else {
                continue;
            };
            for line in s.lines() {
                let mut fields = line.split_whitespace();
                let Some(ty) = fields.next() else { continue };
                if ty.starts_with('#') {
                    continue;
                }
                for ext in fields {
                    if ext.starts_with('#') {
                        break;
                    }
                    let mut t = ty.to_string();
                    if t.starts_with("text/") && !t.contains("charset") {
                        t.push_str("; charset=utf-8");
                    }
                    m.insert(format!(".{}", ext.to_ascii_lowercase()), t);
                }
            }
        }
        m
    })
}

/// extension of a base name, with its dot ("" without one), as filepath.Ext.
pub fn extension(name: &str) -> &str {
    match name.rfind(['.', '/']) {
        Some(i) if name.as_bytes()[i] == b'.' => &name[i..],
        _ => "",
    }
}

/// by_extension is mime.TypeByExtension (built-in types win).
pub fn by_extension(name: &str) -> Option<String> {
    let ext = extension(name);
    if ext.is_empty() {
        return None;
    }
    let lower = ext.to_ascii_lowercase();
    if let Some((_, t)) = BUILTIN.iter().find(|(e, _)| *e == lower) {
        return Some(t.to_string());
    }
    system_types().get(&lower).cloned()
}

/// sniff guesses a type from a file's first bytes (at most 512).
pub fn sniff(data: &[u8]) -> &'static str {
    let data = &data[..data.len().min(512)];
    let ws = data
        .iter()
        .position(|c| !matches!(c, b'\t' | b'\n' | b'\x0c' | b'\r' | b' '))
        .unwrap_or(data.len());
    let trimmed = &data[ws..];
    const HTML: &[&[u8]] = &[
        b"<!DOCTYPE HTML",
        b"<HTML",
        b"<HEAD",
        b"<SCRIPT",
        b"<IFRAME",
        b"<H1",
        b"<DIV",
        b"<FONT",
        b"<TABLE",
        b"<A",
        b"<STYLE",
        b"<TITLE",
        b"<B",
        b"<BODY",
        b"<BR",
        b"<P",
        b"<!--",
    ];
    for sig in HTML {
        if trimmed.len() > sig.len()
            && trimmed[..sig.len()].eq_ignore_ascii_case(sig)
            && matches!(trimmed[sig.len()], b' ' | b'>')
        {
            return "text/html; charset=utf-8";
        }
    }
    if trimmed.starts_with(b"<?xml") {
        return "text/xml; charset=utf-8";
    }
    const EXACT: &[(&[u8], &str)] = &[
        (b"%PDF-", "application/pdf"),
        (b"%!PS-Adobe-", "application/postscript"),
        (b"GIF87a", "image/gif"),
        (b"GIF89a", "image/gif"),
        (b"\x89PNG\x0d\x0a\x1a\x0a", "image/png"),
        (b"\xff\xd8\xff", "image/jpeg"),
        (b"BM", "image/bmp"),
        (b"\x1f\x8b\x08", "application/x-gzip"),
        (b"PK\x03\x04", "application/zip"),
        (b"Rar!\x1a\x07\x00", "application/x-rar-compressed"),
        (b"Rar!\x1a\x07\x01\x00", "application/x-rar-compressed"),
        (b"\x00\x61\x73\x6d", "application/wasm"),
        (b"OggS\x00", "application/ogg"),
        (b"\x1a\x45\xdf\xa3", "video/webm"),
        (b"ID3", "audio/mpeg"),
        (b"wOFF", "font/woff"),
        (b"wOF2", "font/woff2"),
    ];
    for (sig, t) in EXACT {
        if data.starts_with(sig) {
            return t;
        }
    }
    if data.len() >= 12 && &data[..4] == b"RIFF" && &data[8..12] == b"WEBP" {
        return "image/webp";
    }
    if data.len() >= 12 && &data[..4] == b"RIFF" && &data[8..12] == b"WAVE" {
        return "audio/wave";
    }
    if data.starts_with(b"\xfe\xff") {
        return "text/plain; charset=utf-16be";
    }
    if data.starts_with(b"\xff\xfe") {
        return "text/plain; charset=utf-16le";
    }
    if data.starts_with(b"\xef\xbb\xbf") {
        return "text/plain; charset=utf-8";
    }
    if data
        .iter()
        .any(|&c| matches!(c, 0x00..=0x08 | 0x0b | 0x0e..=0x1a | 0x1c..=0x1f))
    {
        return "application/octet-stream";
    }
    "text/plain; charset=utf-8"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types() {
        assert_eq!(by_extension("a.JSON").as_deref(), Some("application/json"));
        assert_eq!(by_extension("a.html").as_deref(), Some("text/html; charset=utf-8"));
        assert_eq!(by_extension("noext"), None);
        assert_eq!(extension("a.tar.gz"), ".gz");
        assert_eq!(extension(".bashrc"), ".bashrc");
        assert_eq!(sniff(b"hello world\n"), "text/plain; charset=utf-8");
        assert_eq!(sniff(b""), "text/plain; charset=utf-8");
        assert_eq!(sniff(b"\x00\x01\x02"), "application/octet-stream");
        assert_eq!(sniff(b"  <html><body>"), "text/html; charset=utf-8");
        assert_eq!(sniff(b"\x89PNG\x0d\x0a\x1a\x0a...."), "image/png");
    }
}
