package local

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/runtime"
)

// Which process wrote a sandbox's file (runtime.Change.Writer) comes from
// fanotify, with Options.TrackWriters. Everything a sandbox writes lands
// on its disk tmpfs (the overlay's upper layer), and overlayfs writes
// there in the writer's own context: a filesystem mark on that tmpfs
// reports each creation, rename, attribute change and close after a write
// with the writer's pid and the file handle of the upper inode, whichever
// namespaces the writer is in. A mark on the overlay itself cannot do it:
// overlayfs (without nfs_export) refuses file handles in events, and
// events with an fd report no creations or renames, nor paths that mean
// anything outside the sandbox's mount namespace.
//
// The group is notification only (FAN_CLASS_NOTIF: a writer never waits
// for sandboxd) and one for the whole backend, a mark per sandbox: the
// kernel allows a user 128 fanotify groups (fs.fanotify.max_user_groups),
// fewer than the sandboxes of one host, and root is no exception. Its
// events say which filesystem they are on (fsid), which says whose
// sandbox. One goroutine reads them all; a reader of the changes first
// drains what is queued (sync), so a change made before the call is
// attributed in its answer.
//
// The record is keyed by the upper inode's file handle, not by path:
// renames (of the file or of any directory above it) keep it, and the
// changes look their entries' handles up. It holds the last writer of
// every inode of the layer that still exists (FAN_DELETE_SELF drops the
// others), at most maxWriterPaths of them; past that, or when the kernel's
// queue overflowed (16384 events by default, shared by all sandboxes),
// the record says it is truncated. A pause to disk turns it into a record
// by path (the layer's inodes do not survive the copy), and the resume
// back into handles on the restored layer; a restart of sandboxd loses it.

// writerMask are the events that make a process a path's writer. Not
// FAN_MODIFY: one event per write(2) would cost big writes; a file still
// open for writing was created (FAN_CREATE) or copied up (FAN_MOVED_TO or
// FAN_CREATE) by its writer, or is attributed to its previous one until
// closed.
const writerMask = unix.FAN_CREATE | unix.FAN_MOVED_TO | unix.FAN_CLOSE_WRITE | unix.FAN_ATTRIB |
	unix.FAN_DELETE_SELF | unix.FAN_ONDIR

// maxWriterPaths bounds a sandbox's record of writers (a variable for
// the tests' sake).
var maxWriterPaths = 100_000

// maxWriterProcs bounds a sandbox's cache of the processes it saw write;
// beyond, the cache starts again.
const maxWriterProcs = 4096

// ErrWritersUnsupported wraps the error of a kernel that refuses the
// fanotify flags writer tracking needs (FAN_REPORT_TARGET_FID is Linux
// 5.17; file handles on tmpfs, 5.10 or later depending on the distribution).
var ErrWritersUnsupported = errors.New("fanotify cannot track writers on this kernel")

// fsid is a filesystem's id as statfs(2) and fanotify report it.
type fsid [8]byte

// writerTracker is the backend's fanotify group.
type writerTracker struct {
	log  *slog.Logger
	self int // sandboxd's pid: its own writes (a restore) are nobody's

	mu      sync.Mutex // guards the fields below
	f       *os.File   // the group, nil until the first arm
	rc      syscall.RawConn
	initErr error
	armErr  error // the last arm's error: a kernel that cannot, mostly
	bySB    map[fsid]*writerRecord
	done    chan struct{} // closed when the reader ended

	readMu sync.Mutex // one reader of the group at a time
	buf    []byte
}

func newWriterTracker(log *slog.Logger) *writerTracker {
	return &writerTracker{log: log, self: os.Getpid(), bySB: map[fsid]*writerRecord{}, buf: make([]byte, 64<<10)}
}

// writerRecord is one sandbox's record of writers. It outlives pauses and
// resumes; it is armed (its disk marked, its fsid known to the tracker)
// while the sandbox runs.
type writerRecord struct {
	mu        sync.Mutex
	byHandle  map[string]*runtime.Writer // key: handleKey
	byPath    map[string]*runtime.Writer // while paused to disk; nil otherwise
	truncated bool

	// While armed: the sandbox's init (envd) by its pid here and the
	// depth of its pid namespace below ours (NSpid's index of a pid in
	// it), its disk and that disk's fsid, and the processes seen.
	armed   bool
	initPid int
	level   int
	disk    string
	fs      fsid
	procs   map[int]procEntry
}

// newWriterRecord is a new sandbox's record; nil when writers are not
// tracked.
func (b *Backend) newWriterRecord() *writerRecord {
	if b.writers == nil {
		return nil
	}
	return &writerRecord{byHandle: map[string]*runtime.Writer{}}
}

// procEntry is a process seen writing: w is nil for one outside the
// sandbox (its writes are not recorded).
type procEntry struct {
	// /proc/<pid>/stat's starttime and comm: a reused pid has another
	// start, an exec another comm (mostly).
	start, comm string
	w           *runtime.Writer
	checked     time.Time // when /proc last said it was this process
}

// procTrust is how long a process seen writing is taken to be the same
// one under its pid without asking /proc again. Reading /proc/<pid>/stat
// for each read of the group (a few events, when sandboxd keeps up) was
// three quarters of the reader's time in BenchmarkWriterTracking. A pid is
// not reused that fast (the kernel allocates them in a cycle); an exec
// is the case this can miss, for its first writes within procTrust.
const procTrust = 10 * time.Millisecond

// open makes the group and starts its reader, once; its error stays.
// The caller holds t.mu.
func (t *writerTracker) open() error {
	if t.f != nil || t.initErr != nil {
		return t.initErr
	}
	fd, err := unix.FanotifyInit(unix.FAN_CLASS_NOTIF|unix.FAN_CLOEXEC|unix.FAN_NONBLOCK|unix.FAN_REPORT_DFID_NAME_TARGET,
		unix.O_RDONLY|unix.O_CLOEXEC|unix.O_LARGEFILE)
	if err != nil {
		if errors.Is(err, unix.EINVAL) {
			err = fmt.Errorf("%w: fanotify_init(FAN_REPORT_DFID_NAME_TARGET): %w", ErrWritersUnsupported, err)
		} else {
			err = fmt.Errorf("fanotify_init: %w", err)
		}
		t.initErr = err
		return err
	}
	f := os.NewFile(uintptr(fd), "fanotify")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		t.initErr = fmt.Errorf("fanotify: %w", err)
		return t.initErr
	}
	t.f, t.rc, t.done = f, rc, make(chan struct{})
	go t.read(rc, t.done)
	return nil
}

// read handles events as they come until the group is closed.
func (t *writerTracker) read(rc syscall.RawConn, done chan struct{}) {
	defer close(done)
	var fatal error
	err := rc.Read(func(fd uintptr) bool {
		t.readMu.Lock()
		defer t.readMu.Unlock()
		fatal = t.drain(int(fd))
		return fatal != nil // false: wait until readable again
	})
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.f == nil {
		return // closed
	}
	// Nothing more is recorded: say so in every record.
	t.log.Warn("local backend: writer tracking stopped", "err", errors.Join(fatal, err))
	for _, r := range t.bySB {
		r.mu.Lock()
		r.truncated = true
		r.mu.Unlock()
	}
}

// sync handles every event queued so far.
func (t *writerTracker) sync() {
	t.mu.Lock()
	rc := t.rc
	t.mu.Unlock()
	if rc == nil {
		return
	}
	t.readMu.Lock()
	defer t.readMu.Unlock()
	_ = rc.Control(func(fd uintptr) { _ = t.drain(int(fd)) })
}

// drain reads and handles events until none is queued; it returns only a
// read error other than "none left". The caller holds t.readMu.
func (t *writerTracker) drain(fd int) error {
	for {
		n, err := unix.Read(fd, t.buf)
		switch {
		case errors.Is(err, unix.EAGAIN):
			return nil
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return fmt.Errorf("read fanotify events: %w", err)
		}
		t.handle(t.buf[:n])
	}
}

// event is one parsed event that may name a writer.
type event struct {
	rec  *writerRecord
	key  string
	pid  int
	gone bool // FAN_DELETE_SELF
}

// handle parses a read's events and applies them to their records.
func (t *writerTracker) handle(buf []byte) {
	var evs []event
	t.mu.Lock()
	for len(buf) >= int(unsafe.Sizeof(unix.FanotifyEventMetadata{})) {
		n := int(binary.NativeEndian.Uint32(buf))
		metaLen := int(binary.NativeEndian.Uint16(buf[6:]))
		if n < metaLen || n > len(buf) {
			break
		}
		mask := binary.NativeEndian.Uint64(buf[8:])
		pid := int(int32(binary.NativeEndian.Uint32(buf[20:])))
		if mask&unix.FAN_Q_OVERFLOW != 0 {
			for _, r := range t.bySB {
				r.mu.Lock()
				r.truncated = true
				r.mu.Unlock()
			}
		} else if fs, key, ok := objectFID(buf[metaLen:n]); ok {
			if r := t.bySB[fs]; r != nil {
				evs = append(evs, event{rec: r, key: key, pid: pid, gone: mask&unix.FAN_DELETE_SELF != 0})
			}
		}
		buf = buf[n:]
	}
	t.mu.Unlock()
	var cur *writerRecord
	now := time.Now()
	for _, e := range evs {
		if e.rec != cur {
			if cur != nil {
				cur.mu.Unlock()
			}
			cur = e.rec
			cur.mu.Lock()
		}
		if !cur.armed {
			continue // disarmed since: its events are late
		}
		if e.gone {
			delete(cur.byHandle, e.key)
			continue
		}
		l := cur.lookup(e.pid, t.self, now) // from its cache but every procTrust
		if !l.record {
			continue
		}
		if _, had := cur.byHandle[e.key]; !had && len(cur.byHandle) >= maxWriterPaths {
			cur.truncated = true
			continue
		}
		cur.byHandle[e.key] = l.w
	}
	if cur != nil {
		cur.mu.Unlock()
	}
}

// objectFID returns the filesystem and handle key of the object an event
// is about, from its info records: the child's (FAN_EVENT_INFO_TYPE_FID,
// which FAN_REPORT_TARGET_FID adds to creations and renames), else the
// directory's for an event on the directory itself.
func objectFID(info []byte) (fsid, string, bool) {
	var dir []byte
	for len(info) >= 4 {
		typ, n := info[0], int(binary.NativeEndian.Uint16(info[2:]))
		if n < 4 || n > len(info) {
			break
		}
		rec := info[4:n]
		info = info[n:]
		if len(rec) < 16 {
			continue
		}
		switch typ {
		case unix.FAN_EVENT_INFO_TYPE_FID:
			return fidKey(rec)
		case unix.FAN_EVENT_INFO_TYPE_DFID:
			dir = rec
		case unix.FAN_EVENT_INFO_TYPE_DFID_NAME:
			hb := int(binary.NativeEndian.Uint32(rec[8:]))
			if 16+hb <= len(rec) && (bytes.HasPrefix(rec[16+hb:], []byte(".\x00")) || len(rec) == 16+hb) {
				dir = rec
			}
		}
	}
	if dir != nil {
		return fidKey(dir)
	}
	return fsid{}, "", false
}

// fidKey reads a fid record: fsid, then struct file_handle (size, type,
// bytes). The key is the type and the bytes, as handleKey makes it.
func fidKey(rec []byte) (fsid, string, bool) {
	var fs fsid
	copy(fs[:], rec[:8])
	hb := int(binary.NativeEndian.Uint32(rec[8:]))
	if 16+hb > len(rec) {
		return fs, "", false
	}
	return fs, string(rec[12 : 16+hb]), true
}

// handleKey is the key of the inode of name in directory dirfd (not
// followed), as fidKey makes it from an event.
func handleKey(dirfd int, name string) (string, error) {
	h, _, err := unix.NameToHandleAt(dirfd, name, 0)
	if err != nil {
		return "", err
	}
	b := binary.NativeEndian.AppendUint32(nil, uint32(h.Type()))
	return string(append(b, h.Bytes()...)), nil
}

// procLookup is what a pid of an event stands for.
type procLookup struct {
	w      *runtime.Writer
	record bool // a process of the sandbox (w may be nil: gone unseen)
}

// lookup identifies the writer with pid (ours), from /proc: its pid, name
// and command line in the sandbox, and the command of envd it belongs to.
// A process outside the sandbox's pid namespace is not recorded. The
// caller holds r.mu.
func (r *writerRecord) lookup(pid, self int, now time.Time) procLookup {
	if pid <= 0 || pid == self {
		return procLookup{}
	}
	cached, known := r.procs[pid]
	if known && now.Sub(cached.checked) < procTrust {
		return procLookup{w: cached.w, record: cached.w != nil}
	}
	st, err := readStat(pid)
	if err != nil {
		// Exited and reaped: the process seen under this pid before is
		// likelier than anything else; one never seen is unknown.
		if known {
			return procLookup{w: cached.w, record: cached.w != nil}
		}
		return procLookup{record: true}
	}
	if known && cached.start == st.start && cached.comm == st.comm {
		cached.checked = now
		r.procs[pid] = cached
		return procLookup{w: cached.w, record: cached.w != nil}
	}
	w := r.describe(pid, st)
	if len(r.procs) >= maxWriterProcs {
		clear(r.procs)
	}
	r.procs[pid] = procEntry{start: st.start, comm: st.comm, w: w, checked: now}
	return procLookup{w: w, record: w != nil}
}

// describe reads what runtime.Writer says of pid; nil when it is not in
// the sandbox's pid namespace (or below it).
func (r *writerRecord) describe(pid int, st procStat) *runtime.Writer {
	ns, err := readNSpid(pid)
	if err != nil || len(ns) <= r.level {
		return nil
	}
	w := &runtime.Writer{PID: ns[r.level], Comm: st.comm}
	if raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); err == nil {
		w.Command = commandLine(raw)
	}
	switch {
	case pid == r.initPid:
	case st.session == pid && st.ppid == r.initPid:
		w.EnvdPID = w.PID
	case st.session > 0 && st.session != pid:
		if ls, err := readStat(st.session); err == nil && ls.ppid == r.initPid {
			if lns, err := readNSpid(st.session); err == nil && len(lns) > r.level {
				w.EnvdPID = lns[r.level]
			}
		}
	}
	return w
}

// commandLine joins a /proc cmdline's arguments with spaces, cut at
// runtime.MaxWriterCommand bytes (on a UTF-8 boundary).
func commandLine(raw []byte) string {
	s := strings.TrimRight(string(raw), "\x00")
	s = strings.ReplaceAll(s, "\x00", " ")
	if len(s) > runtime.MaxWriterCommand {
		s = strings.ToValidUTF8(s[:runtime.MaxWriterCommand], "")
	}
	return s
}

// procStat is what writers need of /proc/<pid>/stat.
type procStat struct {
	comm          string
	ppid, session int
	start         string
}

func readStat(pid int) (procStat, error) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	// "pid (comm) state ppid pgrp session ... starttime(22nd) ...": comm
	// may hold anything, parentheses and spaces included.
	open, end := bytes.IndexByte(raw, '('), bytes.LastIndexByte(raw, ')')
	if open < 0 || end < open {
		return procStat{}, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	f := strings.Fields(string(raw[end+1:]))
	if len(f) < 20 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	ppid, err1 := strconv.Atoi(f[1])
	sid, err2 := strconv.Atoi(f[3])
	if err := errors.Join(err1, err2); err != nil {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return procStat{comm: string(raw[open+1 : end]), ppid: ppid, session: sid, start: f[19]}, nil
}

// readNSpid returns pid's pids from our pid namespace down to its own.
func readNSpid(pid int) ([]int, error) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil, err
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		rest, ok := strings.CutPrefix(line, "NSpid:")
		if !ok {
			continue
		}
		var out []int
		for _, f := range strings.Fields(rest) {
			n, err := strconv.Atoi(f)
			if err != nil {
				return nil, fmt.Errorf("/proc/%d/status: NSpid: %w", pid, err)
			}
			out = append(out, n)
		}
		return out, nil
	}
	return nil, fmt.Errorf("/proc/%d/status: no NSpid", pid)
}

// arm marks disk, the sandbox's tmpfs, for rec; initPid is its envd.
func (t *writerTracker) arm(rec *writerRecord, disk string, initPid int) error {
	if initPid <= 0 {
		return errors.New("track writers: no init pid")
	}
	ns, err := readNSpid(initPid)
	if err != nil {
		return fmt.Errorf("track writers: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(disk, &st); err != nil {
		return fmt.Errorf("track writers: statfs %s: %w", disk, err)
	}
	var fs fsid
	binary.NativeEndian.PutUint32(fs[:4], uint32(st.Fsid.Val[0]))
	binary.NativeEndian.PutUint32(fs[4:], uint32(st.Fsid.Val[1]))

	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.open(); err != nil {
		return err
	}
	if other := t.bySB[fs]; other != nil && other != rec {
		// Two disks with one fsid: their events could not be told apart.
		return fmt.Errorf("track writers: %s has the fsid of another sandbox's disk", disk)
	}
	rec.mu.Lock()
	rec.armed, rec.initPid, rec.level, rec.disk, rec.fs = true, initPid, len(ns)-1, disk, fs
	if rec.procs == nil {
		rec.procs = map[int]procEntry{}
	}
	if rec.byHandle == nil {
		rec.byHandle = map[string]*runtime.Writer{} // a record by path that could not be turned back
	}
	rec.mu.Unlock()
	t.bySB[fs] = rec
	var markErr error
	err = t.rc.Control(func(fd uintptr) {
		markErr = unix.FanotifyMark(int(fd), unix.FAN_MARK_ADD|unix.FAN_MARK_FILESYSTEM, writerMask, unix.AT_FDCWD, disk)
	})
	if err = errors.Join(err, markErr); err != nil {
		delete(t.bySB, fs)
		rec.mu.Lock()
		rec.armed = false
		rec.mu.Unlock()
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EXDEV) {
			return fmt.Errorf("%w: fanotify_mark(FAN_MARK_FILESYSTEM) on %s: %w", ErrWritersUnsupported, disk, err)
		}
		return fmt.Errorf("track writers: fanotify_mark %s: %w", disk, err)
	}
	return nil
}

// disarm removes rec's mark, after handling what is queued (drain: for a
// sandbox that goes on, paused).
func (t *writerTracker) disarm(rec *writerRecord, drain bool) {
	if drain {
		t.sync()
	}
	rec.mu.Lock()
	armed, disk, fs := rec.armed, rec.disk, rec.fs
	rec.armed, rec.procs = false, nil
	rec.mu.Unlock()
	if !armed {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.bySB[fs] == rec {
		delete(t.bySB, fs)
	}
	if t.rc == nil {
		return
	}
	var markErr error
	_ = t.rc.Control(func(fd uintptr) {
		markErr = unix.FanotifyMark(int(fd), unix.FAN_MARK_REMOVE|unix.FAN_MARK_FILESYSTEM, writerMask, unix.AT_FDCWD, disk)
	})
	// ENOENT: no mark there (any more): the disk went, and its mark
	// with it.
	if markErr != nil && !errors.Is(markErr, unix.ENOENT) {
		t.log.Warn("local backend: remove writer mark", "disk", disk, "err", markErr)
	}
}

// close closes the group (its marks go with it) and waits for its reader.
func (t *writerTracker) close() {
	t.mu.Lock()
	f, done := t.f, t.done
	t.f, t.rc = nil, nil
	clear(t.bySB)
	t.mu.Unlock()
	if f == nil {
		return
	}
	_ = f.Close()
	<-done
}

// marks counts the group's marks, from its fdinfo: for the tests' check
// that none is left behind.
func (t *writerTracker) marks() (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rc == nil {
		return 0, nil
	}
	var n int
	var err error
	cerr := t.rc.Control(func(fd uintptr) {
		var raw []byte
		raw, err = os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", fd))
		n = bytes.Count(raw, []byte("\nfanotify sdev:")) // filesystem marks; the group's own line is "fanotify flags:"
	})
	return n, errors.Join(cerr, err)
}

// writersByPath returns rec's writers of the entries of upper, by path.
// The caller holds rec.mu.
func (r *writerRecord) writersByPath(upper string) (map[string]*runtime.Writer, error) {
	out := map[string]*runtime.Writer{}
	if len(r.byHandle) == 0 {
		return out, nil
	}
	entries, err := walkUpper(upper)
	if err != nil {
		return nil, err
	}
	rels := make([]string, len(entries))
	for i, e := range entries {
		rels[i] = e.rel
	}
	err = eachHandle(upper, rels, func(rel, key string) {
		if w, ok := r.byHandle[key]; ok {
			out["/"+rel] = w
		}
	})
	return out, err
}

// toHandles turns the record by path of a sandbox paused to disk into one
// by the handles of upper, its restored layer. The caller holds r.mu.
func (r *writerRecord) toHandles(upper string) error {
	if r.byPath == nil {
		return nil
	}
	rels := make([]string, 0, len(r.byPath))
	for p := range r.byPath {
		rels = append(rels, strings.TrimPrefix(p, "/"))
	}
	byHandle := map[string]*runtime.Writer{}
	err := eachHandle(upper, rels, func(rel, key string) { byHandle[key] = r.byPath["/"+rel] })
	if err != nil {
		return err
	}
	r.byHandle, r.byPath = byHandle, nil
	return nil
}

// eachHandle calls fn with the handle key of each of rels (slash-separated,
// relative to upper) that exists. Each is looked up in its directory opened
// through an os.Root, so no name the sandbox made leads out of upper.
func eachHandle(upper string, rels []string, fn func(rel, key string)) error {
	root, err := os.OpenRoot(upper)
	if err != nil {
		return err
	}
	defer root.Close()
	var (
		dirName = "\x00" // none open
		dir     *os.File
	)
	defer func() {
		if dir != nil {
			dir.Close()
		}
	}()
	for _, rel := range rels {
		d, name := path.Split(rel)
		d = strings.TrimSuffix(d, "/")
		if d == "" {
			d = "."
		}
		if d != dirName {
			if dir != nil {
				dir.Close()
				dir = nil
			}
			dirName = d
			// O_DIRECTORY: a FIFO the sandbox put there since would
			// block a plain open.
			f, err := root.OpenFile(d, os.O_RDONLY|unix.O_DIRECTORY, 0)
			if err != nil {
				continue // gone since, or not a directory
			}
			dir = f
		}
		if dir == nil {
			continue
		}
		var key string
		var herr error
		rc, err := dir.SyscallConn()
		if err != nil {
			return err
		}
		if err := rc.Control(func(fd uintptr) { key, herr = handleKey(int(fd), name) }); err != nil {
			return err
		}
		if herr == nil {
			fn(rel, key)
		}
	}
	return nil
}

// writers attaches rec's writers to changes of upper. The caller has
// synced the tracker (a running sandbox) or rec is by path (paused to
// disk).
func (r *writerRecord) attach(upper string, chs []runtime.Change) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byPath != nil {
		for i := range chs {
			if chs[i].Kind != runtime.ChangeDeleted {
				chs[i].Writer = r.byPath[chs[i].Path]
			}
		}
		return nil
	}
	if len(r.byHandle) == 0 {
		return nil
	}
	idx := map[string]int{}
	rels := make([]string, 0, len(chs))
	for i, c := range chs {
		if c.Kind == runtime.ChangeDeleted {
			continue
		}
		rel := strings.TrimPrefix(c.Path, "/")
		idx[rel] = i
		rels = append(rels, rel)
	}
	return eachHandle(upper, rels, func(rel, key string) {
		if w, ok := r.byHandle[key]; ok {
			chs[idx[rel]].Writer = w
		}
	})
}

// writersByPath drains what is queued and returns s's writers by path,
// from its layer (still mounted); nil when s is not tracked.
func (b *Backend) writersByPath(s *sandbox) (map[string]*runtime.Writer, error) {
	if b.writers == nil || s.writers == nil {
		return nil, nil
	}
	b.writers.sync()
	s.writers.mu.Lock()
	defer s.writers.mu.Unlock()
	return s.writers.writersByPath(s.upperDir())
}

// armWriters starts recording s's writers; initPid is its envd. A kernel
// that cannot leaves s untracked, said once in the log.
func (b *Backend) armWriters(s *sandbox, initPid int) {
	if b.writers == nil || s.writers == nil {
		return
	}
	err := b.writers.arm(s.writers, s.diskDir(), initPid)
	b.writers.mu.Lock()
	b.writers.armErr = err
	b.writers.mu.Unlock()
	if err != nil {
		b.writersWarn.Do(func() { b.log.Warn("local backend: writers are not tracked", "sandbox", s.id, "err", err) })
	}
}

// disarmWriters stops recording s's writers (they stay recorded); drain
// first handles what is queued.
func (b *Backend) disarmWriters(s *sandbox, drain bool) {
	if b.writers != nil && s.writers != nil {
		b.writers.disarm(s.writers, drain)
	}
}

// WritersTruncated reports whether sandbox id's record of writers is
// incomplete: bounded at maxWriterPaths, or events were lost.
func (b *Backend) WritersTruncated(ctx context.Context, id string) (bool, error) {
	s, err := b.get(ctx, id)
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	rec := s.writers
	s.mu.Unlock()
	if rec == nil {
		return false, nil
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.truncated, nil
}

// WriterTracking says whether writers are tracked: nil, or why not (off,
// or the error of the last sandbox that could not be, which errors.Is
// ErrWritersUnsupported when the kernel refused fanotify's flags).
func (b *Backend) WriterTracking() error {
	if b.writers == nil {
		return errors.New("writer tracking is off (Options.TrackWriters)")
	}
	b.writers.mu.Lock()
	defer b.writers.mu.Unlock()
	return b.writers.armErr
}

// WriterMarks counts the fanotify marks the backend holds: one per
// running sandbox whose writers it tracks.
func (b *Backend) WriterMarks() (int, error) {
	if b.writers == nil {
		return 0, nil
	}
	return b.writers.marks()
}
