package mesh

// Benchmarks of the binding (go test -bench . with run-tests.sh's environment), and
// TestCompareMeshbench, which puts them beside meshbench's figures in the same run (C's libmesh
// through the same two meshd) and prints Go's overhead as ratios, never asserting a time.

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// streamServer reads each channel to EOF and answers with the byte count (8 bytes, little endian).
func streamServer(l *Listener) {
	for {
		c, err := l.AcceptMesh()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			n, _ := io.CopyBuffer(io.Discard, struct{ io.Reader }{c}, make([]byte, 1<<20))
			var b [8]byte
			binary.LittleEndian.PutUint64(b[:], uint64(n))
			c.Write(b[:])
		}()
	}
}

// stream writes msgs messages of size bytes (or for dur when msgs is 0) and waits for the
// server's count; it returns the bytes and the time from the first write to the count.
func stream(tb testing.TB, d *Dialer, p uint16, size, msgs int, dur time.Duration) (int64, time.Duration) {
	c, err := d.Dial("mesh", fmt.Sprintf("2:%d", p))
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, size)
	var sent int64
	t0 := time.Now()
	for i := 0; msgs == 0 || i < msgs; i++ {
		if msgs == 0 && i%64 == 0 && time.Since(t0) >= dur {
			break
		}
		n, err := c.Write(buf)
		sent += int64(n)
		if err != nil {
			tb.Fatal(err)
		}
	}
	c.(*Conn).CloseWrite()
	var b [8]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		tb.Fatal(err)
	}
	el := time.Since(t0)
	if got := int64(binary.LittleEndian.Uint64(b[:])); got != sent {
		tb.Fatalf("server read %d bytes of %d", got, sent)
	}
	return sent, el
}

func echoOnce(l *Listener) {
	for {
		c, err := l.AcceptMesh()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			io.Copy(c, struct{ io.Reader }{c})
		}()
	}
}

// pingPong does iters round trips of size bytes and returns every half round trip, sorted.
func pingPong(tb testing.TB, d *Dialer, p uint16, size, iters int) []time.Duration {
	c, err := d.Dial("mesh", fmt.Sprintf("2:%d", p))
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, size)
	half := make([]time.Duration, 0, iters)
	for i := -16; i < iters; i++ { // 16 warm-up rounds, as meshbench
		t0 := time.Now()
		if _, err := c.Write(buf); err != nil {
			tb.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			tb.Fatal(err)
		}
		if i >= 0 {
			half = append(half, time.Since(t0)/2)
		}
	}
	sort.Slice(half, func(i, j int) bool { return half[i] < half[j] })
	return half
}

func BenchmarkStream64KiB(b *testing.B) {
	needMesh(b)
	l, p := listen(b)
	defer l.Close()
	go streamServer(l)
	b.SetBytes(64 << 10)
	b.ResetTimer()
	stream(b, dialer(), p, 64<<10, b.N, 0)
}

func BenchmarkPingPong64(b *testing.B) {
	needMesh(b)
	l, p := listen(b)
	defer l.Close()
	go echoOnce(l)
	b.ResetTimer()
	half := pingPong(b, dialer(), p, 64, b.N)
	b.ReportMetric(float64(half[len(half)/2].Nanoseconds())/1e3, "half-rtt-us")
}

// meshbench runs the C benchmark client against a meshbench server on node 2 and returns its JSON.
func meshbench(t *testing.T, p uint16, args ...string) map[string]interface{} {
	bin := filepath.Join(tm.build, "meshlib", "meshbench")
	a := append([]string{"-s", tm.sock[1], "-j"}, args...)
	a = append(a, "2", fmt.Sprint(p))
	out, err := exec.Command(bin, a...).Output()
	if err != nil {
		t.Fatalf("meshbench %s: %v", strings.Join(a, " "), err)
	}
	var v map[string]interface{}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &v); err != nil {
		t.Fatalf("meshbench output %q: %v", out, err)
	}
	return v
}

// TestCompareMeshbench: meshbench (C, copying through mesh_send/mesh_recv: -C) and the Go binding
// over the same mesh in the same run; prints both and Go's ratio. Runs with MESH_GO_COMPARE=1
// (run-tests.sh --bench), without -race (the race detector would measure itself).
func TestCompareMeshbench(t *testing.T) {
	needMesh(t)
	if os.Getenv("MESH_GO_COMPARE") == "" {
		t.Skip("MESH_GO_COMPARE is not set (run-tests.sh --bench sets it)")
	}
	if tm.build == "" {
		t.Skip("needs the build directory's meshbench")
	}
	sp := port()
	srv := exec.Command(filepath.Join(tm.build, "meshlib", "meshbench"), "-s", tm.sock[2], "-l", fmt.Sprint(sp))
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	time.Sleep(300 * time.Millisecond)
	gl, gp := listen(t)
	defer gl.Close()
	go streamServer(gl)
	el, ep := listen(t)
	defer el.Close()
	go echoOnce(el)
	d := dialer()

	const secs = 3
	fmt.Printf("%-34s %12s %12s %8s\n", "test (1 MiB ring, tcp provider)", "C meshbench", "Go binding", "Go/C")
	for _, size := range []int{4096, 65536} {
		c := meshbench(t, sp, "-t", "bw", "-C", "-m", fmt.Sprint(size), "-D", fmt.Sprint(secs))["mb_s"].(float64)
		n, dt := stream(t, d, gp, size, 0, secs*time.Second)
		g := float64(n) / dt.Seconds() / 1e6
		fmt.Printf("%-34s %9.1f MB/s %7.1f MB/s %8.2f\n", fmt.Sprintf("bw, %d-byte writes", size), c, g, g/c)
	}
	for _, size := range []int{64, 4096} {
		c := meshbench(t, sp, "-t", "lat", "-C", "-m", fmt.Sprint(size), "-n", "5000")["t_typical_us"].(float64)
		half := pingPong(t, d, ep, size, 5000)
		g := float64(half[len(half)/2].Nanoseconds()) / 1e3
		fmt.Printf("%-34s %9.1f us   %7.1f us   %8.2f\n", fmt.Sprintf("lat, %d bytes (median half RTT)", size), c, g, g/c)
	}
	fmt.Println("Go/C: above 1 for lat and below 1 for bw is Go's overhead; figures vary run to run")
}
