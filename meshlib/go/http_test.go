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
	"net/http"
	"sync"
	"testing"
	"time"
)

// net/http's own server and client over the mesh: http.Serve on a mesh listener, a Transport
// whose DialContext dials the mesh.
func TestHTTPOverMesh(t *testing.T) {
	needMesh(t)
	l, p := listen(t)
	blob := make([]byte, 8<<20)
	rand.New(rand.NewSource(7)).Read(blob)
	mux := http.NewServeMux()
	mux.HandleFunc("/blob", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Remote", r.RemoteAddr)
		w.Write(blob)
	})
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		// HTTP/1.x: the whole request body before the response (net/http's rule).
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Write(b)
	})
	srv := &http.Server{Handler: mux}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()

	d := dialer()
	var dials int
	var mu sync.Mutex
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			mu.Lock()
			dials++
			mu.Unlock()
			return d.DialContext(ctx, "mesh", fmt.Sprintf("2:%d", p))
		},
		MaxIdleConnsPerHost: 4,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 60 * time.Second}

	resp, err := client.Get("http://node2/blob")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || sha256.Sum256(body) != sha256.Sum256(blob) {
		t.Fatalf("GET /blob: status %d, %d bytes, %v", resp.StatusCode, len(body), err)
	}
	if got := resp.Header.Get("X-Remote"); got != "1:"+fmt.Sprint(mustRemotePort(t, got)) {
		t.Errorf("the server saw the client as %q, want node 1", got)
	}

	post := blob[:3<<20]
	resp, err = client.Post("http://node2/echo", "application/octet-stream", bytes.NewReader(post))
	if err != nil {
		t.Fatal(err)
	}
	body, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !bytes.Equal(body, post) {
		t.Fatalf("POST /echo: %d bytes back of %d, %v", len(body), len(post), err)
	}

	// Concurrent requests over a few kept-alive channels.
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			msg := bytes.Repeat([]byte{byte(i)}, 1000*(i+1))
			resp, err := client.Post("http://node2/echo", "application/octet-stream", bytes.NewReader(msg))
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			defer resp.Body.Close()
			if b, err := io.ReadAll(resp.Body); err != nil || !bytes.Equal(b, msg) {
				t.Errorf("request %d: %d bytes back, %v", i, len(b), err)
			}
		}(i)
	}
	wg.Wait()
	mu.Lock()
	t.Logf("%d requests over %d channels", 18, dials)
	if dials > 17 {
		t.Errorf("%d dials for 18 requests: keep-alive did not reuse channels", dials)
	}
	mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Serve returned %v, want http.ErrServerClosed", err)
	}
}

func mustRemotePort(t *testing.T, s string) uint16 {
	a, err := ParseAddr(s)
	if err != nil {
		t.Fatalf("RemoteAddr %q: %v", s, err)
	}
	return a.Port
}
