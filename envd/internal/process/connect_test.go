package process

import (
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	rpc "github.com/sandboxd/sandboxd/envd/api/process"
)

func TestConnectConcurrentReaders(t *testing.T) {
	e := newTestEnv(t)
	ev := e.start(t, t.Context(), &rpc.StartRequest{Process: sh(`echo early; read a; echo "one $a"; read b; echo "two $b"`), Tag: ptr("job")}, nil)
	pid := ev.started()
	ev.until("early")

	// Readers attach by pid and by tag. Start is sent once a reader is
	// subscribed, so after it they cannot miss later output.
	readers := []*events{
		e.connect(t, t.Context(), byPid(pid), nil),
		e.connect(t, t.Context(), byTag("job"), nil),
	}
	for _, r := range readers {
		if got := r.started(); got != pid {
			t.Fatalf("Connect start pid = %d; want %d", got, pid)
		}
	}
	e.sendStdin(t, pid, "x\n")
	for _, r := range readers {
		r.until("one x\n")
	}
	e.sendStdin(t, pid, "y\n")
	for i, r := range append(readers, ev) {
		res := r.rest()
		if got := res.stdout.String(); got != "two y\n" && got != "one x\ntwo y\n" {
			t.Errorf("reader %d: rest of stdout = %q", i, got)
		}
		if res.end.GetExitCode() != 0 {
			t.Errorf("reader %d: end = %v", i, res.end)
		}
	}
}

func TestConnectAfterExit(t *testing.T) {
	e := newTestEnv(t)
	pid, r := e.run(t, &rpc.StartRequest{Process: sh("echo gone; exit 7"), Tag: ptr("done"), Stdin: ptr(false)}, nil)
	if r.end.GetExitCode() != 7 {
		t.Fatalf("end = %v", r.end)
	}
	for _, sel := range []*rpc.ProcessSelector{byPid(pid), byTag("done")} {
		c := e.connect(t, t.Context(), sel, nil)
		if got := c.started(); got != pid {
			t.Fatalf("late Connect(%v) start pid = %d; want %d", sel, got, pid)
		}
		late := c.rest()
		if late.end.GetExitCode() != 7 || late.stdout.Len() != 0 || len(late.kinds) != 1 {
			t.Fatalf("late Connect(%v) = kinds %v, end %v; want only the end with exit 7", sel, late.kinds, late.end)
		}
	}
	// An exited process is gone for everything but Connect.
	_, err := e.client.SendInput(t.Context(), connect.NewRequest(&rpc.SendInputRequest{
		Process: byPid(pid), Input: &rpc.ProcessInput{Input: &rpc.ProcessInput_Stdin{Stdin: []byte("x")}},
	}))
	codeIs(t, "SendInput to exited process", err, connect.CodeNotFound)
	_, err = e.client.SendSignal(t.Context(), connect.NewRequest(&rpc.SendSignalRequest{Process: byPid(pid), Signal: rpc.Signal_SIGNAL_SIGKILL}))
	codeIs(t, "SendSignal to exited process", err, connect.CodeNotFound)
}

func TestConnectRetentionExpires(t *testing.T) {
	e := newTestEnv(t)
	svc := e.service(t, "shortens the Service's retention and looks processes up in it")
	svc.retention = 10 * time.Millisecond
	pid, _ := e.run(t, &rpc.StartRequest{Process: cmd("true"), Tag: ptr("brief"), Stdin: ptr(false)}, nil)
	eventually(t, "retention to expire", func() bool {
		_, err := svc.lookup(byPid(pid))
		return err != nil
	})
	if got := e.connectCode(t, byPid(pid)); got != connect.CodeNotFound {
		t.Errorf("Connect by pid after retention: code %v; want not_found", got)
	}
	if got := e.connectCode(t, byTag("brief")); got != connect.CodeNotFound {
		t.Errorf("Connect by tag after retention: code %v; want not_found", got)
	}
}

func TestConnectUnknown(t *testing.T) {
	e := newTestEnv(t)
	tests := []struct {
		name string
		sel  *rpc.ProcessSelector
		want connect.Code
	}{
		{"pid", byPid(1 << 30), connect.CodeNotFound},
		{"tag", byTag("nope"), connect.CodeNotFound},
		{"empty selector", &rpc.ProcessSelector{}, connect.CodeInvalidArgument},
		{"nil selector", nil, connect.CodeInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := e.connectCode(t, tt.sel); got != tt.want {
				t.Errorf("Connect code = %v; want %v", got, tt.want)
			}
		})
	}
}

func TestTags(t *testing.T) {
	e := newTestEnv(t)
	ev := e.start(t, t.Context(), &rpc.StartRequest{Process: cmd("sleep", "100"), Tag: ptr("svc"), Stdin: ptr(false)}, nil)
	pid := ev.started()

	if got := e.startCode(t, &rpc.StartRequest{Process: cmd("true"), Tag: ptr("svc")}, nil); got != connect.CodeAlreadyExists {
		t.Fatalf("duplicate tag: code %v; want already_exists", got)
	}
	// Signals and input reach a process by tag too.
	e.kill(t, byTag("svc"))
	if r := ev.rest(); r.end.GetStatus() != "signal: killed" {
		t.Fatalf("end = %v", r.end)
	}
	// Once the holder has exited, the tag is free again and names the new process.
	ev2 := e.start(t, t.Context(), &rpc.StartRequest{Process: cmd("cat"), Tag: ptr("svc")}, nil)
	pid2 := ev2.started()
	c := e.connect(t, t.Context(), byTag("svc"), nil)
	if got := c.started(); got != pid2 || got == pid {
		t.Fatalf("Connect by reused tag: pid %d; want %d", got, pid2)
	}
	e.kill(t, byTag("svc"))
	c.rest()
}

func TestList(t *testing.T) {
	e := newTestEnv(t)
	list := func() []*rpc.ProcessInfo {
		t.Helper()
		res, err := e.client.List(t.Context(), connect.NewRequest(&rpc.ListRequest{}))
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		return res.Msg.GetProcesses()
	}
	if got := list(); len(got) != 0 {
		t.Fatalf("List on an idle service = %v", got)
	}

	dir := t.TempDir()
	a := e.start(t, t.Context(), &rpc.StartRequest{
		Process: &rpc.ProcessConfig{Cmd: "sleep", Args: []string{"100"}, Envs: map[string]string{"K": "V"}, Cwd: ptr(dir)},
		Tag:     ptr("a"), Stdin: ptr(false),
	}, nil)
	pidA := a.started()
	b := e.start(t, t.Context(), &rpc.StartRequest{Process: cmd("cat")}, nil)
	pidB := b.started()

	got := map[uint32]*rpc.ProcessInfo{}
	for _, p := range list() {
		got[p.GetPid()] = p
	}
	if len(got) != 2 || got[pidA] == nil || got[pidB] == nil {
		t.Fatalf("List = %v; want pids %d and %d", got, pidA, pidB)
	}
	ia := got[pidA]
	if c := ia.GetConfig(); c.GetCmd() != "sleep" || len(c.GetArgs()) != 1 || c.GetArgs()[0] != "100" ||
		c.GetEnvs()["K"] != "V" || c.GetCwd() != dir || ia.GetTag() != "a" {
		t.Errorf("List entry = %v", ia)
	}
	if ib := got[pidB]; ib.Tag != nil || ib.GetConfig().GetCwd() != "/root" {
		t.Errorf("untagged List entry = %v; want no tag and the resolved cwd", ib)
	}

	e.kill(t, byPid(pidA))
	a.rest()
	if l := list(); len(l) != 1 || l[0].GetPid() != pidB {
		t.Fatalf("List after kill = %v; want only %d", l, pidB)
	}
}

func TestConcurrentStartsWithOneTag(t *testing.T) {
	e := newTestEnv(t)
	const n = 8
	type outcome struct {
		ev   *events
		code connect.Code
	}
	results := make(chan outcome, n)
	var lookups sync.WaitGroup
	t.Cleanup(lookups.Wait)
	for range n {
		go func() {
			s, err := e.client.Start(t.Context(), newReq(&rpc.StartRequest{Process: cmd("sleep", "100"), Tag: ptr("once"), Stdin: ptr(false)}, nil))
			if err != nil {
				results <- outcome{code: connect.CodeOf(err)}
				return
			}
			ev := &events{t, s.Receive, func() *rpc.ProcessEvent { return s.Msg().GetEvent() }, s.Err, s.Close}
			if !s.Receive() {
				results <- outcome{code: connect.CodeOf(s.Err())}
				_ = s.Close()
				return
			}
			results <- outcome{ev: ev}
		}()
		// Lookups by tag race with the starts; they must only ever see a
		// started process. (In process only: they look into the Service.)
		if !e.inProcess() {
			continue
		}
		lookups.Go(func() {
			if p, err := e.svc.lookup(byTag("once")); err == nil && p.pid == 0 {
				t.Errorf("lookup by tag returned a process without a pid")
			}
		})
	}
	var winners []*events
	for range n {
		r := <-results
		switch {
		case r.ev != nil:
			winners = append(winners, r.ev)
		case r.code != connect.CodeAlreadyExists:
			t.Errorf("losing Start: code %v; want already_exists", r.code)
		}
	}
	if len(winners) != 1 {
		t.Fatalf("%d Starts won the tag; want exactly 1", len(winners))
	}
	t.Cleanup(func() { _ = winners[0].close() })
	e.kill(t, byTag("once"))
	winners[0].rest()
}
