//! One error type for every handler, and the one place that maps it to a
//! Connect code and an HTTP status (as envd/internal/rpcerr does for envd).

use std::fmt;
use std::io;

/// Code is a Connect error code: the protocol's whole table, some of
/// which envd never sends.
#[allow(dead_code)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// connect_status is the HTTP status of a unary Connect error (the
    /// Connect protocol's table).
    pub fn connect_status(self) -> u16 {
        match self {
            Code::Canceled => 499,
            Code::Unknown => 500,
            Code::InvalidArgument => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::FailedPrecondition => 400,
            Code::Aborted => 409,
            Code::OutOfRange => 400,
            Code::Unimplemented => 501,
            Code::Internal => 500,
            Code::Unavailable => 503,
            Code::DataLoss => 500,
            Code::Unauthenticated => 401,
        }
    }
}

/// Error is a handler's failure: a code and a message for the client, and
/// the errno when it came from the kernel (the /files routes map ENOSPC to 507).
#[derive(Debug, Clone)]
pub struct Error {
    pub code: Code,
    pub message: String,
    pub errno: Option<i32>,
}

impl Error {
    pub fn new(code: Code, message: impl Into<String>) -> Error {
        Error {
            code,
            message: message.into(),
            errno: None,
        }
    }
    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(Code::InvalidArgument, message)
    }
    pub fn not_found(message: impl Into<String>) -> Error {
        Error::new(Code::NotFound, message)
    }
    pub fn internal(message: impl Into<String>) -> Error {
        Error::new(Code::Internal, message)
    }
    pub fn unauthenticated(message: impl Into<String>) -> Error {
        Error::new(Code::Unauthenticated, message)
    }

    /// io wraps an io::Error with what was being done, coded by its errno
    /// as envd's rpcerr.Code does.
    pub fn io(context: impl fmt::Display, err: io::Error) -> Error {
        let errno = err.raw_os_error();
        let code = match errno {
            Some(
                libc::ENOTDIR
                | libc::EISDIR
                | libc::EINVAL
                | libc::ENAMETOOLONG
                | libc::ELOOP
                | libc::ENOTEMPTY
                | libc::EXDEV,
            ) => Code::InvalidArgument,
            Some(libc::ENOENT) => Code::NotFound,
            Some(libc::EEXIST) => Code::AlreadyExists,
            Some(libc::EACCES | libc::EPERM | libc::EROFS) => Code::PermissionDenied,
            Some(libc::ENOSPC | libc::EDQUOT | libc::EMFILE) => Code::ResourceExhausted,
            _ => match err.kind() {
                io::ErrorKind::NotFound => Code::NotFound,
                io::ErrorKind::AlreadyExists => Code::AlreadyExists,
                io::ErrorKind::PermissionDenied => Code::PermissionDenied,
                io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData => Code::InvalidArgument,
                _ => Code::Internal,
            },
        };
        Error {
            code,
            message: format!("{context}: {}", strip_os_error(&err)),
            errno,
        }
    }

    /// http_status is the status of a plain-HTTP route's error (/files):
    /// envd's rpcerr.HTTPStatus.
    pub fn http_status(&self) -> u16 {
        if matches!(self.errno, Some(libc::ENOSPC | libc::EDQUOT)) {
            return 507;
        }
        match self.code {
            Code::Unauthenticated => 401,
            Code::InvalidArgument => 400,
            Code::NotFound => 404,
            Code::AlreadyExists => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            _ => 500,
        }
    }
}

/// strip_os_error renders an io::Error as Go does ("no such file or
/// directory"), without Rust's " (os error 2)" suffix.
fn strip_os_error(err: &io::Error) -> String {
    match err.raw_os_error() {
        Some(n) => {
            // SAFETY: strerror returns a pointer to a static NUL-terminated string.
            let s = unsafe { std::ffi::CStr::from_ptr(libc::strerror(n)) };
            let mut s = s.to_string_lossy().into_owned();
            if let Some(c) = s.get(..1) {
                s = c.to_lowercase() + &s[1..];
            }
            s
        }
        None => err.to_string(),
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_codes() {
        let cases = [
            (libc::ENOENT, Code::NotFound, 404),
            (libc::EEXIST, Code::AlreadyExists, 409),
            (libc::EACCES, Code::PermissionDenied, 403),
            (libc::ENOTDIR, Code::InvalidArgument, 400),
            (libc::ENOSPC, Code::ResourceExhausted, 507),
            (libc::EIO, Code::Internal, 500),
        ];
        for (errno, code, status) in cases {
            let e = Error::io("open /x", io::Error::from_raw_os_error(errno));
            assert_eq!(e.code, code, "errno {errno}");
            assert_eq!(e.http_status(), status, "errno {errno}");
        }
        let e = Error::io("open /x", io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(e.message, "open /x: no such file or directory");
    }
}
