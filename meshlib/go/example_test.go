package mesh

import (
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The example (example/main.go) built and run: a server on node 2, a client on node 1 whose
// stdin comes back on its stdout.
func TestExampleEcho(t *testing.T) {
	needMesh(t)
	bin := filepath.Join(t.TempDir(), "meshgo-echo")
	if out, err := exec.Command("go", "build", "-o", bin, "./example").CombinedOutput(); err != nil {
		t.Fatalf("go build ./example: %v\n%s", err, out)
	}
	p := port()
	var srvLog bytes.Buffer
	srv := exec.Command(bin, "-s", tm.sock[2], "-l", fmt.Sprint(p))
	srv.Stderr = &srvLog
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	want := make([]byte, 1<<20)
	rand.New(rand.NewSource(3)).Read(want)
	var got []byte
	var err error
	for try := 0; try < 50; try++ { // until the server listens
		cl := exec.Command(bin, "-s", tm.sock[1], fmt.Sprintf("2:%d", p))
		cl.Stdin = bytes.NewReader(want)
		var stderr bytes.Buffer
		cl.Stderr = &stderr
		got, err = cl.Output()
		if err == nil || !strings.Contains(stderr.String(), "refused") {
			if err != nil {
				err = fmt.Errorf("%v: %s", err, stderr.String())
			}
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("client: %d bytes back of %d, %v; server log: %s", len(got), len(want), err, srvLog.String())
	}
	_ = os.Remove(bin)
}
