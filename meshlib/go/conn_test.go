package mesh

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// echoServer accepts channels on l and echoes each until EOF, then shuts its side.
func echoServer(t testing.TB, l *Listener) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.AcceptMesh()
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					t.Errorf("accept: %v", err)
				}
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				buf := make([]byte, 256<<10)
				if _, err := io.CopyBuffer(c, struct{ io.Reader }{c}, buf); err != nil {
					t.Errorf("echo: %v", err)
					return
				}
				c.CloseWrite()
			}()
		}
	}()
	return &wg
}

func TestAddrs(t *testing.T) {
	needMesh(t)
	l, p := listen(t)
	defer l.Close()
	if a := l.Addr().(Addr); a.Node != 2 || a.Port != p || a.Network() != "mesh" || a.String() != fmt.Sprintf("2:%d", p) {
		t.Fatalf("listener address %#v (%s)", a, a)
	}
	c1, c2 := pipe(t, nil)
	defer c1.Close()
	defer c2.Close()
	la, ra := c1.LocalAddr().(Addr), c1.RemoteAddr().(Addr)
	if la.Node != 1 || ra.Node != 2 || la.Network() != "mesh" {
		t.Fatalf("dialler's addresses local %v remote %v", la, ra)
	}
	if c2.LocalAddr().(Addr) != ra || c2.RemoteAddr().(Addr) != la {
		t.Fatalf("acceptor's addresses local %v remote %v, dialler's %v %v", c2.LocalAddr(), c2.RemoteAddr(), la, ra)
	}
}

func TestParseAndBadArguments(t *testing.T) {
	for _, s := range []string{"2", "x:1", "2:x", "65536:1", "2:65536", "-1:2"} {
		if _, err := ParseAddr(s); err == nil {
			t.Errorf("ParseAddr(%q) accepted", s)
		}
	}
	if a, err := ParseAddr("65535:7"); err != nil || a != (Addr{65535, 7}) {
		t.Errorf("ParseAddr(65535:7) = %v, %v", a, err)
	}
	if _, err := Dial("tcp", "2:1"); err == nil || !strings.Contains(err.Error(), "unknown network") {
		t.Errorf("Dial(tcp) = %v", err)
	}
	for _, a := range []string{"2:80", ":0", "nope"} {
		if _, err := Listen("mesh", a); err == nil {
			t.Errorf("Listen(%q) accepted", a)
		}
	}
	d := Dialer{Socket: "/nonexistent/meshd.sock"}
	_, err := d.Dial("mesh", "2:1")
	if !errors.Is(err, syscall.ENOENT) {
		t.Errorf("dial without meshd: %v, want ENOENT", err)
	}
}

func TestEcho64MiB(t *testing.T) {
	needMesh(t)
	l, p := listen(t)
	wg := echoServer(t, l)
	defer func() { l.Close(); wg.Wait() }()

	const size = 64 << 20
	c, err := dialer().Dial("mesh", fmt.Sprintf("2:%d", p))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(90 * time.Second))
	src := rand.New(rand.NewSource(1))
	sent := sha256.New()
	errc := make(chan error, 1)
	go func() {
		buf := make([]byte, 1<<20)
		for n := 0; n < size; n += len(buf) {
			src.Read(buf)
			sent.Write(buf)
			if _, err := c.Write(buf); err != nil {
				errc <- err
				return
			}
		}
		errc <- c.(*Conn).CloseWrite()
	}()
	got := sha256.New()
	n, err := io.CopyBuffer(got, c, make([]byte, 1<<20))
	if err != nil {
		t.Fatalf("reading the echo after %d bytes: %v", n, err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("writing: %v", err)
	}
	if n != size || !bytes.Equal(sent.Sum(nil), got.Sum(nil)) {
		t.Fatalf("echo of %d bytes came back as %d bytes, sha256 %x, want %x", size, n, got.Sum(nil), sent.Sum(nil))
	}
}

func TestRefusedPortAndUnknownNode(t *testing.T) {
	needMesh(t)
	_, err := dialer().Dial("mesh", fmt.Sprintf("2:%d", port()))
	var oe *net.OpError
	if !errors.Is(err, syscall.ECONNREFUSED) || !errors.As(err, &oe) || oe.Op != "dial" {
		t.Fatalf("dial to a port nobody listens on: %v, want a dial OpError with ECONNREFUSED", err)
	}
	_, err = dialer().Dial("mesh", "999:1")
	if !errors.Is(err, EUNKNOWNNODE) {
		t.Fatalf("dial to node 999: %v, want EUNKNOWNNODE", err)
	}
	l, p := listen(t)
	defer l.Close()
	lc := ListenConfig{Socket: tm.sock[2]}
	if _, err := lc.Listen(context.Background(), "mesh", fmt.Sprintf(":%d", p)); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("second listener on port %d: %v, want EADDRINUSE", p, err)
	}
}

func TestDialContextCancelled(t *testing.T) {
	needMesh(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := dialer().DialContext(ctx, "mesh", "2:1"); !errors.Is(err, context.Canceled) {
		t.Fatalf("dial with a cancelled context: %v", err)
	}
	ctx, cancel = context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	_, err := dialer().DialContext(ctx, "mesh", "2:1")
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("dial past the context's deadline: %v", err)
	}
	if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("dial past the context's deadline: %v is not a Timeout() net.Error", err)
	}
}

func TestDialerOptions(t *testing.T) {
	needMesh(t)
	c1, c2 := pipe(t, &Dialer{Socket: tm.sock[1], RingSize: 8192, QPs: 1})
	defer c1.Close()
	defer c2.Close()
	if i := c1.Info(); i.RingSize != 8192 || i.QPs != 1 {
		t.Fatalf("Info() = %+v, want ring 8192 and 1 QP", i)
	}
	_, err := (&Dialer{Socket: tm.sock[1], RingSize: 3000}).Dial("mesh", "2:1")
	if !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("ring size 3000: %v, want EINVAL", err)
	}
}

func TestHalfClose(t *testing.T) {
	needMesh(t)
	c1, c2 := pipe(t, nil)
	defer c1.Close()
	defer c2.Close()
	if _, err := c1.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := c1.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Write([]byte("x")); !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("write after CloseWrite: %v, want EPIPE", err)
	}
	c2.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c2)
	if err != nil || string(b) != "hello" {
		t.Fatalf("peer read %q, %v; want \"hello\" then EOF", b, err)
	}
	// The other direction still works.
	if _, err := c2.Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	c2.Close()
	c1.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err = io.ReadAll(c1)
	if err != nil || string(b) != "bye" {
		t.Fatalf("read %q, %v after the peer's Close; want \"bye\" then EOF", b, err)
	}
}

// Both directions at once on one channel, with a small ring so that both sides wait on each other.
func TestConcurrentReadWrite(t *testing.T) {
	needMesh(t)
	c1, c2 := pipe(t, &Dialer{Socket: tm.sock[1], RingSize: 16384})
	defer c1.Close()
	defer c2.Close()
	const size = 8 << 20
	stream := func(c *Conn, seed int64, res chan<- []byte) {
		h := sha256.New()
		src := rand.New(rand.NewSource(seed))
		buf := make([]byte, 100000)
		for n := 0; n < size; {
			m := buf[:1+src.Intn(len(buf))]
			if n+len(m) > size {
				m = m[:size-n]
			}
			src.Read(m)
			h.Write(m)
			if _, err := c.Write(m); err != nil {
				t.Errorf("write: %v", err)
				break
			}
			n += len(m)
		}
		c.CloseWrite()
		res <- h.Sum(nil)
	}
	drain := func(c *Conn, res chan<- []byte) {
		h := sha256.New()
		if _, err := io.CopyBuffer(h, c, make([]byte, 7000)); err != nil {
			t.Errorf("read: %v", err)
		}
		res <- h.Sum(nil)
	}
	c1.SetDeadline(time.Now().Add(60 * time.Second))
	c2.SetDeadline(time.Now().Add(60 * time.Second))
	s1, s2, r1, r2 := make(chan []byte, 1), make(chan []byte, 1), make(chan []byte, 1), make(chan []byte, 1)
	go stream(c1, 1, s1)
	go stream(c2, 2, s2)
	go drain(c1, r1)
	go drain(c2, r2)
	if a, b := <-s1, <-r2; !bytes.Equal(a, b) {
		t.Errorf("node 1 -> 2: sent %x, received %x", a, b)
	}
	if a, b := <-s2, <-r1; !bytes.Equal(a, b) {
		t.Errorf("node 2 -> 1: sent %x, received %x", a, b)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) && errors.As(err, &ne) && ne.Timeout()
}

func TestDeadlines(t *testing.T) {
	needMesh(t)
	c1, c2 := pipe(t, &Dialer{Socket: tm.sock[1], RingSize: 4096})
	defer c1.Close()
	defer c2.Close()
	buf := make([]byte, 64)

	// In the past: fails at once, even with bytes waiting (as package net does).
	c2.Write([]byte("x"))
	c1.SetReadDeadline(time.Now().Add(-time.Second))
	if _, err := c1.Read(buf); !isTimeout(err) {
		t.Fatalf("read past its deadline: %v", err)
	}
	c1.SetReadDeadline(time.Time{})
	if n, err := c1.Read(buf); n != 1 || err != nil {
		t.Fatalf("read after clearing the deadline: %d, %v", n, err)
	}
	c1.SetWriteDeadline(time.Now().Add(-time.Second))
	if _, err := c1.Write(buf); !isTimeout(err) {
		t.Fatalf("write past its deadline: %v", err)
	}
	c1.SetWriteDeadline(time.Time{})

	// In the future: a waiting Read returns when it passes, not before.
	t0 := time.Now()
	c1.SetReadDeadline(t0.Add(200 * time.Millisecond))
	if _, err := c1.Read(buf); !isTimeout(err) {
		t.Fatalf("read with a deadline 200 ms ahead: %v", err)
	}
	if d := time.Since(t0); d < 200*time.Millisecond || d > 5*time.Second {
		t.Fatalf("read timed out after %v, deadline 200 ms", d)
	}
	// Moved further while waiting: the wait follows it.
	c1.SetReadDeadline(time.Now().Add(time.Hour))
	go func() {
		time.Sleep(100 * time.Millisecond)
		c1.SetReadDeadline(time.Now())
	}()
	if _, err := c1.Read(buf); !isTimeout(err) {
		t.Fatalf("read whose deadline was moved to now: %v", err)
	}
	c1.SetReadDeadline(time.Time{})

	// A writer blocked on a full ring (nobody reads on the other side) times out, having written
	// part of the buffer.
	big := make([]byte, 1<<20)
	c1.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
	n, err := c1.Write(big)
	if !isTimeout(err) || n <= 0 || n >= len(big) {
		t.Fatalf("write into a full ring: %d, %v; want part of it and a timeout", n, err)
	}
	c1.SetWriteDeadline(time.Time{})
	// The channel still works after timeouts: the peer gets exactly the n bytes.
	c1.CloseWrite()
	c2.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c2)
	if err != nil || len(got) != n {
		t.Fatalf("peer read %d bytes, %v; want %d", len(got), err, n)
	}
}

// blockReadWrite starts a Read and a Write on c that wait (nothing comes; more than a 4 KiB ring and
// the peer's is written) and gives the channels their errors arrive on.
func blockReadWrite(c *Conn) (rerr, werr chan error) {
	rerr, werr = make(chan error, 1), make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 10))
		rerr <- err
	}()
	go func() {
		_, err := c.Write(make([]byte, 1<<20))
		werr <- err
	}()
	return rerr, werr
}

// awaitUnblocked expects every blocked call of blockReadWrite to end with want within limit of what
// unblocked them.
func awaitUnblocked(t *testing.T, want error, limit time.Duration, what string, errs ...chan error) {
	t.Helper()
	for _, ch := range errs {
		select {
		case err := <-ch:
			if !errors.Is(err, want) {
				t.Errorf("blocked call after %s: %v, want %v", what, err, want)
			}
		case <-time.After(limit):
			t.Fatalf("a Read or Write still waits %v after %s", limit, what)
		}
	}
}

func TestCloseUnblocks(t *testing.T) {
	needMesh(t)
	c1, c2 := pipe(t, &Dialer{Socket: tm.sock[1], RingSize: 4096})
	defer c2.Close()
	rerr, werr := blockReadWrite(c1)
	time.Sleep(200 * time.Millisecond)
	select {
	case err := <-rerr:
		t.Fatalf("read returned before Close: %v", err)
	case err := <-werr:
		t.Fatalf("write returned before Close: %v", err)
	default:
	}
	c1.Close()
	awaitUnblocked(t, net.ErrClosed, 5*time.Second, "Close", rerr, werr)
	if _, err := c1.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("read after Close: %v", err)
	}
	if err := c1.Close(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
	if err := c1.SetDeadline(time.Now()); !errors.Is(err, net.ErrClosed) {
		t.Errorf("SetDeadline after Close: %v", err)
	}
	// The peer sees the end of the stream.
	c2.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, c2); err != nil {
		t.Errorf("peer after Close: %v, want EOF", err)
	}

	// Accept too.
	l, _ := listen(t)
	aerr := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		aerr <- err
	}()
	time.Sleep(100 * time.Millisecond)
	l.Close()
	select {
	case err := <-aerr:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock Accept")
	}
}

// meshd dies (SIGKILL) under a Read and a Write that wait: both return EMESHDGONE instead of waiting
// for their deadline (the channel fd's lifeline turns readable; neither clears the fd, so the look
// before each wait must ask whether meshd is still there). A mesh of its own: the shared one stays.
func TestMeshdGoneUnblocks(t *testing.T) {
	needMesh(t)
	if tm.build == "" {
		t.Skip("a re-executed test process: no meshd of its own to kill")
	}
	m, err := startMesh(tm.build)
	if m != nil {
		defer os.RemoveAll(m.dir)
		defer m.stop()
	}
	if err != nil {
		t.Fatal(err)
	}
	l, err := (&ListenConfig{Socket: m.sock[2]}).Listen(context.Background(), "mesh", ":7")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			defer c.Close()
			time.Sleep(30 * time.Second) // reads nothing, writes nothing
		}
	}()
	c, err := (&Dialer{Socket: m.sock[1], RingSize: 4096, Timeout: 20 * time.Second}).Dial("mesh", "2:7")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	rerr, werr := blockReadWrite(c.(*Conn))
	time.Sleep(300 * time.Millisecond)
	m.procs[0].Process.Kill() // node 1, this process's meshd
	awaitUnblocked(t, EMESHDGONE, 10*time.Second, "meshd's death", rerr, werr)
}

// 1000 goroutines blocked in Read park in the runtime poller: the process stays under 64 OS threads.
// Run in a fresh process so that threads made by earlier tests do not count.
func TestThousandBlockedReaders(t *testing.T) {
	needMesh(t)
	if os.Getenv(childEnv) == "" {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestThousandBlockedReaders$", "-test.v")
		cmd.Env = append(os.Environ(), childEnv+"="+tm.sock[1]+" "+tm.sock[2])
		out, err := cmd.CombinedOutput()
		t.Logf("child:\n%s", out)
		if err != nil {
			t.Fatalf("child: %v", err)
		}
		return
	}
	const n = 1000
	l, p := listen(t)
	defer l.Close()
	accepted := make(chan *Conn, n)
	go func() {
		for {
			c, err := l.AcceptMesh()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	d := &Dialer{Socket: tm.sock[1], RingSize: 4096, Timeout: 60 * time.Second}
	dialled := make([]*Conn, n)
	var wg sync.WaitGroup
	var dialErr error
	var mu sync.Mutex
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < n; i += 4 {
				c, err := d.Dial("mesh", fmt.Sprintf("2:%d", p))
				if err != nil {
					mu.Lock()
					dialErr = err
					mu.Unlock()
					return
				}
				dialled[i] = c.(*Conn)
			}
		}(w)
	}
	wg.Wait()
	if dialErr != nil {
		t.Fatalf("dial: %v", dialErr)
	}
	peers := make([]*Conn, n)
	for i := range peers {
		peers[i] = <-accepted
	}
	defer func() {
		for i := range peers {
			peers[i].Close()
			dialled[i].Close()
		}
	}()
	results := make(chan error, n)
	var started sync.WaitGroup
	for i := range dialled {
		started.Add(1)
		go func(c *Conn) {
			started.Done()
			b := make([]byte, 8)
			c.SetReadDeadline(time.Now().Add(2 * time.Minute))
			m, err := io.ReadFull(c, b)
			if err == nil && string(b[:m]) != "wake up!" {
				err = fmt.Errorf("read %q", b[:m])
			}
			results <- err
		}(dialled[i])
	}
	started.Wait()
	time.Sleep(time.Second) // let all of them reach the poller
	threads := countThreads(t)
	t.Logf("%d goroutines blocked in Read on %d channels: %d OS threads", n, n, threads)
	if threads >= 64 {
		t.Errorf("%d OS threads with %d goroutines blocked in Read; want < 64", threads, n)
	}
	select {
	case err := <-results:
		t.Fatalf("a reader returned before anything was sent: %v", err)
	default:
	}
	for _, c := range peers {
		if _, err := c.Write([]byte("wake up!")); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i++ {
		if err := <-results; err != nil {
			t.Fatalf("reader: %v", err)
		}
	}
}

func countThreads(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "Threads:") {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "Threads:")))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads: in /proc/self/status")
	return 0
}

// A channel to this node's own id: node 2 dials itself, and the bytes echo intact, ring to ring
// inside its meshd; both addresses name node 2.
func TestLocalNode(t *testing.T) {
	needMesh(t)
	l, p := listen(t)
	wg := echoServer(t, l)
	defer func() { l.Close(); wg.Wait() }()

	d := &Dialer{Socket: tm.sock[2], Timeout: 20 * time.Second}
	c, err := d.Dial("mesh", fmt.Sprintf("2:%d", p))
	if err != nil {
		t.Fatalf("dial node 2's own id: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	if la, ra := c.LocalAddr().(Addr), c.RemoteAddr().(Addr); la.Node != 2 || ra.Node != 2 || ra.Port != p {
		t.Fatalf("addresses %v -> %v, want node 2 at both ends, port %d", la, ra, p)
	}
	const size = 8 << 20
	msg := make([]byte, size)
	rand.New(rand.NewSource(2)).Read(msg)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(msg)
		if err == nil {
			err = c.(*Conn).CloseWrite()
		}
		errc <- err
	}()
	back, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading the echo after %d bytes: %v", len(back), err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("writing: %v", err)
	}
	if !bytes.Equal(back, msg) {
		t.Fatalf("echo of %d bytes came back as %d bytes, different", size, len(back))
	}
}

// Dials that wait park in the runtime poller, not in OS threads: 1000 dials to a "meshd" that takes
// every request and never answers keep the process under 64 threads, and each returns with its
// context's deadline, the request's connection closed.
func TestDialParksWhileMeshdAnswers(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/silent.sock"
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var held sync.Map
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			held.Store(c, true) // reads the request never, answers never
		}
	}()
	defer held.Range(func(k, _ any) bool { k.(*net.UnixConn).Close(); return true })

	const n = 1000
	threads := countThreads(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	d := &Dialer{Socket: path}
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			c, err := d.DialContext(ctx, "mesh", "2:80")
			if c != nil {
				c.Close()
			}
			errs <- err
		}()
	}
	time.Sleep(1500 * time.Millisecond)
	if now := countThreads(t); now >= 64 {
		t.Errorf("%d dials waiting: %d OS threads (%d before), want under 64", n, now, threads)
	}
	for i := 0; i < n; i++ {
		if err := <-errs; !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("dial %d: %v, want the context's deadline", i, err)
		}
	}
}
