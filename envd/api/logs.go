package envdapi

import "time"

// LogsPath is envd's route of its own recent log records:
//
//	GET /logs?after=<seq>&boot=<boot>      (X-Access-Token once /init set one)
//
// It answers a LogsResponse. Records are envd's slog records at info and
// above, whatever level envd writes to stderr at, in a bounded ring: the
// oldest go first, so a reader that comes too late finds a gap in the
// sequence numbers. Sequence numbers start at 1 with every start of envd,
// which draws a new boot id: the answer holds every record envd still has
// when boot is not its own (a reader's cursor of an earlier envd) or after
// is beyond its newest record, and those with a greater seq otherwise.
const LogsPath = "/logs"

// LogRecord is one of envd's log records.
type LogRecord struct {
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	// Level is debug, info, warn or error.
	Level string `json:"level"`
	Msg   string `json:"msg"`
	// Fields are the record's attributes as strings; a group's keys are
	// prefixed with its name and a dot.
	Fields map[string]string `json:"fields,omitempty"`
}

// LogsResponse is the answer of GET /logs.
type LogsResponse struct {
	// Boot identifies this run of envd.
	Boot string `json:"boot"`
	// Last is the seq of envd's newest record, 0 when it has none.
	Last    uint64      `json:"last"`
	Records []LogRecord `json:"records"`
}
