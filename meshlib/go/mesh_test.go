package mesh

// The tests start their own mesh: two meshd over the tcp provider on 127.0.0.1 (free ports), from
// the build directory named by $MESH_BUILD (run-tests.sh sets it). Node 1's socket is what the
// tests dial from, node 2's where they listen (TestLocalNode dials node 1's own id).

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

type testMesh struct {
	dir   string
	build string
	sock  [3]string // sock[1], sock[2]
	procs []*exec.Cmd
}

var (
	tm       *testMesh
	meshSkip string // why there is no mesh (the tests that need one skip with it)
	nextPort atomic.Int32
)

const childEnv = "MESH_GO_TEST_CHILD" // a re-executed test binary: the mesh's sockets come from here

func TestMain(m *testing.M) {
	nextPort.Store(20000)
	if socks := os.Getenv(childEnv); socks != "" {
		var s [3]string
		if _, err := fmt.Sscanf(socks, "%s %s", &s[1], &s[2]); err != nil {
			fmt.Fprintln(os.Stderr, "bad", childEnv, socks)
			os.Exit(2)
		}
		tm = &testMesh{sock: s}
		os.Exit(m.Run())
	}
	build := os.Getenv("MESH_BUILD")
	if build == "" {
		meshSkip = "MESH_BUILD is not set: no meshd to test against (meshlib/go/run-tests.sh sets it)"
		os.Exit(m.Run())
	}
	var err error
	tm, err = startMesh(build)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mesh:", err)
		if tm != nil {
			tm.dumpLogs()
			tm.stop()
		}
		os.Exit(1)
	}
	code := m.Run()
	if code != 0 {
		tm.dumpLogs()
	}
	if !tm.stop() && code == 0 {
		fmt.Fprintln(os.Stderr, "a meshd did not stop cleanly")
		code = 1
	}
	os.RemoveAll(tm.dir)
	os.Exit(code)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startMesh(build string) (*testMesh, error) {
	dir, err := os.MkdirTemp("", "mesh-gotest-")
	if err != nil {
		return nil, err
	}
	t := &testMesh{dir: dir, build: build}
	key, err := exec.Command(filepath.Join(build, "node", "meshctl"), "keygen").Output()
	if err != nil {
		return t, fmt.Errorf("meshctl keygen: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cluster.key"), key, 0o600); err != nil {
		return t, err
	}
	var ports [3]int
	for i := 1; i <= 2; i++ {
		if ports[i], err = freePort(); err != nil {
			return t, err
		}
		t.sock[i] = filepath.Join(dir, fmt.Sprintf("meshd%d.sock", i))
	}
	conf := fmt.Sprintf(`cluster = { name = "gotest"; transport = "tcp"; qps_per_link = 2;
  keepalive_interval_ms = 500; keepalive_timeout_ms = 15000; key_file = "cluster.key"; socket_group = ""; };
nodes = (
  { id = 1; addr = "127.0.0.1"; port = %d; },
  { id = 2; addr = "127.0.0.1"; port = %d; }
);
`, ports[1], ports[2])
	confPath := filepath.Join(dir, "mesh.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return t, err
	}
	for i := 1; i <= 2; i++ {
		log, err := os.Create(filepath.Join(dir, fmt.Sprintf("meshd%d.log", i)))
		if err != nil {
			return t, err
		}
		cmd := exec.Command(filepath.Join(build, "node", "meshd"), "-c", confPath, "-n", strconv.Itoa(i), "-s", t.sock[i])
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			log.Close()
			return t, err
		}
		log.Close()
		t.procs = append(t.procs, cmd)
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if t.linksUp(1) == 1 && t.linksUp(2) == 1 {
			return t, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return t, fmt.Errorf("the link between node 1 and node 2 did not come UP within 60 s")
}

func (t *testMesh) linksUp(node int) int {
	out, err := exec.Command(filepath.Join(t.build, "node", "meshctl"), "-j", "-s", t.sock[node], "node").Output()
	if err != nil {
		return -1
	}
	var v struct {
		Node struct {
			LinksUp int `json:"links_up"`
		} `json:"node"`
		LinksUp *int `json:"links_up"`
	}
	if json.Unmarshal(out, &v) != nil {
		return -1
	}
	if v.LinksUp != nil {
		return *v.LinksUp
	}
	return v.Node.LinksUp
}

func (t *testMesh) stop() bool {
	ok := true
	for _, p := range t.procs {
		p.Process.Signal(os.Interrupt)
	}
	for _, p := range t.procs {
		done := make(chan error, 1)
		go func(p *exec.Cmd) { done <- p.Wait() }(p)
		select {
		case err := <-done:
			if err != nil {
				ok = false
			}
		case <-time.After(10 * time.Second):
			p.Process.Kill()
			<-done
			ok = false
		}
	}
	return ok
}

func (t *testMesh) dumpLogs() {
	for i := 1; i <= 2; i++ {
		b, _ := os.ReadFile(filepath.Join(t.dir, fmt.Sprintf("meshd%d.log", i)))
		if len(b) > 4000 {
			b = b[len(b)-4000:]
		}
		fmt.Fprintf(os.Stderr, "--- meshd %d log (tail)\n%s\n", i, b)
	}
}

func needMesh(t testing.TB) {
	t.Helper()
	if tm == nil {
		t.Skip(meshSkip)
	}
}

// port hands out a port no other test of this run uses.
func port() uint16 { return uint16(nextPort.Add(1)) }

// dialer dials from node 1.
func dialer() *Dialer { return &Dialer{Socket: tm.sock[1], Timeout: 20 * time.Second} }

// listen listens on node 2.
func listen(t testing.TB) (*Listener, uint16) {
	t.Helper()
	p := port()
	lc := ListenConfig{Socket: tm.sock[2]}
	l, err := lc.Listen(context.Background(), "mesh", fmt.Sprintf(":%d", p))
	if err != nil {
		t.Fatalf("listen on node 2 port %d: %v", p, err)
	}
	return l.(*Listener), p
}

// pipe is a connected pair: c1 dialled from node 1, c2 accepted on node 2.
func pipe(t testing.TB, d *Dialer) (c1, c2 *Conn) {
	t.Helper()
	l, p := listen(t)
	defer l.Close()
	type acc struct {
		c   *Conn
		err error
	}
	ch := make(chan acc, 1)
	go func() {
		c, err := l.AcceptMesh()
		ch <- acc{c, err}
	}()
	if d == nil {
		d = dialer()
	}
	c, err := d.Dial("mesh", fmt.Sprintf("2:%d", p))
	if err != nil {
		t.Fatalf("dial 2:%d: %v", p, err)
	}
	a := <-ch
	if a.err != nil {
		c.Close()
		t.Fatalf("accept: %v", a.err)
	}
	return c.(*Conn), a.c
}
