package envdconn

import (
	"context"
	"net"
	"sync"
	"time"
)

// DefaultKeepIdle is how long a Keeper keeps a connection nobody used: more
// than a pool member's recheck interval (30 s), so that a member waiting to
// be claimed keeps one from check to check.
const DefaultKeepIdle = 45 * time.Second

// Keeper keeps one idle connection to each sandbox's envd between two
// control requests. A warm member's health check leaves the connection that
// its claim's /init then uses: the claim does not dial envd's socket, nor
// envd accept, which was half of the CPU of a claim's /init in sandboxd.
//
// Only for requests that may be sent twice (GET /health, POST /init): a
// kept connection that fails is replaced by a new one and the request sent
// again, since the failure may be the peer's end of an envd that restarted
// (a resume) or died.
//
// A request that keeps a connection also drops those idle for MaxIdle, at
// most once per MaxIdle, so while requests come none stays idle for much
// over twice MaxIdle (a sandbox destroyed without Forget: a pool's member);
// Forget drops a sandbox's at once.
type Keeper struct {
	// MaxIdle is how long an unused connection is kept; zero means
	// DefaultKeepIdle.
	MaxIdle time.Duration

	mu     sync.Mutex
	idle   map[string]keptConn
	swept  time.Time
	closed bool // Close ran: nothing is kept any more
}

type keptConn struct {
	c  net.Conn
	at time.Time
}

// Ask is the package's Ask on sandbox id's kept connection, or on a new one
// from dial; the connection is kept afterwards when envd left it open.
func (k *Keeper) Ask(ctx context.Context, id string, dial DialFunc, method, path string, body []byte) (int, []byte, error) {
	return k.ask(ctx, id, dial, method, path, body, true)
}

// AskLast is Ask for the last request in a while (a claim's /init, after
// which the sandbox's envd is the proxy's): it uses the kept connection,
// and keeps none.
func (k *Keeper) AskLast(ctx context.Context, id string, dial DialFunc, method, path string, body []byte) (int, []byte, error) {
	return k.ask(ctx, id, dial, method, path, body, false)
}

func (k *Keeper) ask(ctx context.Context, id string, dial DialFunc, method, path string, body []byte, again bool) (int, []byte, error) {
	if c := k.take(id); c != nil {
		status, msg, keep, err := askOn(ctx, c, method, path, body)
		if err == nil {
			k.put(id, c, keep && again)
			return status, msg, nil
		}
		_ = c.Close()
		if ctx.Err() != nil {
			return 0, nil, err
		}
	}
	c, err := dial(ctx)
	if err != nil {
		return 0, nil, err
	}
	status, msg, keep, err := askOn(ctx, c, method, path, body)
	if err != nil {
		_ = c.Close()
		return 0, nil, err
	}
	k.put(id, c, keep && again)
	return status, msg, nil
}

// Forget closes sandbox id's kept connection, if any.
func (k *Keeper) Forget(id string) {
	if c := k.take(id); c != nil {
		_ = c.Close()
	}
}

// Close closes every kept connection; requests after it keep none.
func (k *Keeper) Close() {
	k.mu.Lock()
	idle := k.idle
	k.idle, k.closed = nil, true
	k.mu.Unlock()
	for _, kc := range idle {
		_ = kc.c.Close()
	}
}

func (k *Keeper) take(id string) net.Conn {
	k.mu.Lock()
	defer k.mu.Unlock()
	kc, ok := k.idle[id]
	if !ok {
		return nil
	}
	delete(k.idle, id)
	return kc.c
}

// put keeps c as id's connection if keep, else closes it; a connection
// id already has (two requests at once) is closed. It drops the
// connections idle for longer than MaxIdle, at most once per MaxIdle.
func (k *Keeper) put(id string, c net.Conn, keep bool) {
	if !keep {
		_ = c.Close()
		return
	}
	maxIdle := k.MaxIdle
	if maxIdle <= 0 {
		maxIdle = DefaultKeepIdle
	}
	now := time.Now()
	var stale []net.Conn
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		_ = c.Close()
		return
	}
	if old, ok := k.idle[id]; ok {
		stale = append(stale, old.c)
	}
	if k.idle == nil {
		k.idle = map[string]keptConn{}
	}
	k.idle[id] = keptConn{c: c, at: now}
	if now.Sub(k.swept) >= maxIdle {
		k.swept = now
		for kid, kc := range k.idle {
			if now.Sub(kc.at) >= maxIdle {
				stale = append(stale, kc.c)
				delete(k.idle, kid)
			}
		}
	}
	k.mu.Unlock()
	for _, s := range stale {
		_ = s.Close()
	}
}

// askOn sends Ask's request on c (roundTrip).
func askOn(ctx context.Context, c net.Conn, method, path string, body []byte) (status int, msg []byte, keep bool, err error) {
	req, err := newAsk(ctx, method, path, body)
	if err != nil {
		return 0, nil, false, err
	}
	return roundTrip(ctx, c, req, askLimit)
}
