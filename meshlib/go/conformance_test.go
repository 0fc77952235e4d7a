package mesh

// Conformance cases in the manner of golang.org/x/net/nettest's TestConn (that module cannot be
// fetched here, so they are written again): what any net.Conn must do, run over a mesh channel.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

func TestConnConformance(t *testing.T) {
	needMesh(t)
	cases := []struct {
		name string
		fn   func(t *testing.T, c1, c2 net.Conn)
	}{
		{"BasicIO", testBasicIO},
		{"PingPong", testPingPong},
		{"RacyRead", testRacyRead},
		{"RacyWrite", testRacyWrite},
		{"ReadTimeout", testReadTimeout},
		{"WriteTimeout", testWriteTimeout},
		{"PastTimeout", testPastTimeout},
		{"PresentTimeout", testPresentTimeout},
		{"FutureTimeout", testFutureTimeout},
		{"CloseTimeout", testCloseTimeout},
		{"ConcurrentMethods", testConcurrentMethods},
	}
	for _, tc := range cases {
		tc := tc
		t.Run(tc.name, func(t *testing.T) {
			c1, c2 := pipe(t, &Dialer{Socket: tm.sock[1], RingSize: 65536})
			defer c1.Close()
			defer c2.Close()
			tc.fn(t, c1, c2)
		})
	}
}

func checkTimeout(t *testing.T, err error) {
	t.Helper()
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("got %v, want a Timeout() net.Error that is os.ErrDeadlineExceeded", err)
	}
}

// testBasicIO: bytes written to c1 come out of c2, in order; CloseWrite ends the stream.
func testBasicIO(t *testing.T, c1, c2 net.Conn) {
	want := make([]byte, 1<<20)
	rand.New(rand.NewSource(0)).Read(want)
	done := make(chan struct{})
	go func() {
		defer close(done)
		rd := bytes.NewReader(want)
		if _, err := chunkedCopy(c1, rd); err != nil {
			t.Errorf("copy: %v", err)
		}
		if err := c1.(*Conn).CloseWrite(); err != nil {
			t.Errorf("CloseWrite: %v", err)
		}
	}()
	var got bytes.Buffer
	if _, err := chunkedCopy(&got, c2); err != nil {
		t.Errorf("copy: %v", err)
	}
	<-done
	if !bytes.Equal(got.Bytes(), want) {
		t.Errorf("transmitted data differs (%d bytes of %d)", got.Len(), len(want))
	}
}

// testPingPong: two goroutines hand a counter back and forth.
func testPingPong(t *testing.T, c1, c2 net.Conn) {
	var wg sync.WaitGroup
	defer wg.Wait()
	pingPonger := func(c net.Conn) {
		defer wg.Done()
		buf := make([]byte, 8)
		var prev uint64
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				if err != io.EOF {
					t.Errorf("read: %v", err)
				}
				return
			}
			v := binary.LittleEndian.Uint64(buf)
			binary.LittleEndian.PutUint64(buf, v+1)
			if prev != 0 && prev+2 != v {
				t.Errorf("mismatching value: got %d, want %d", v, prev+2)
			}
			prev = v
			if v == 1000 {
				c.(*Conn).CloseWrite()
				return
			}
			if _, err := c.Write(buf); err != nil {
				t.Errorf("write: %v", err)
				return
			}
		}
	}
	wg.Add(2)
	go pingPonger(c1)
	go pingPonger(c2)
	if _, err := c1.Write(make([]byte, 8)); err != nil {
		t.Errorf("start: %v", err)
	}
}

// testRacyRead: many concurrent Reads with moving deadlines neither crash nor race.
func testRacyRead(t *testing.T, c1, c2 net.Conn) {
	go chunkedCopy(c2, rand.New(rand.NewSource(0)))
	var wg sync.WaitGroup
	defer wg.Wait()
	c1.SetReadDeadline(time.Now().Add(time.Millisecond))
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b1, b2 := make([]byte, 1024), make([]byte, 1024)
			for j := 0; j < 100; j++ {
				_, err := c1.Read(b1[:rand.Intn(len(b1))])
				copy(b1, b2) // mutate b1 to trigger a potential race
				if err != nil {
					checkTimeout(t, err)
					c1.SetReadDeadline(time.Now().Add(time.Millisecond))
				}
			}
		}()
	}
}

// testRacyWrite: many concurrent Writes with moving deadlines neither crash nor race.
func testRacyWrite(t *testing.T, c1, c2 net.Conn) {
	go chunkedCopy(io.Discard, c2)
	var wg sync.WaitGroup
	defer wg.Wait()
	c1.SetWriteDeadline(time.Now().Add(time.Millisecond))
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b1, b2 := make([]byte, 1024), make([]byte, 1024)
			for j := 0; j < 100; j++ {
				_, err := c1.Write(b1[:rand.Intn(len(b1))])
				copy(b1, b2)
				if err != nil {
					checkTimeout(t, err)
					c1.SetWriteDeadline(time.Now().Add(time.Millisecond))
				}
			}
		}()
	}
}

// testReadTimeout: a Read with nothing to read times out.
func testReadTimeout(t *testing.T, c1, c2 net.Conn) {
	go chunkedCopy(io.Discard, c2)
	c1.SetReadDeadline(aLongTimeAgo)
	_, err := c1.Read(make([]byte, 1024))
	checkTimeout(t, err)
}

// testWriteTimeout: a Write nobody reads times out.
func testWriteTimeout(t *testing.T, c1, c2 net.Conn) {
	go chunkedCopy(c2, rand.New(rand.NewSource(0)))
	c1.SetWriteDeadline(aLongTimeAgo)
	_, err := c1.Write(make([]byte, 1024))
	checkTimeout(t, err)
}

// testPastTimeout: deadlines in the past fail Read and Write at once, every time.
func testPastTimeout(t *testing.T, c1, c2 net.Conn) {
	go chunkedCopy(c2, c2)
	testRoundtrip(t, c1)
	c1.SetDeadline(aLongTimeAgo)
	n, err := c1.Write(make([]byte, 1024))
	if n != 0 {
		t.Errorf("unexpected Write count: got %d, want 0", n)
	}
	checkTimeout(t, err)
	n, err = c1.Read(make([]byte, 1024))
	if n != 0 {
		t.Errorf("unexpected Read count: got %d, want 0", n)
	}
	checkTimeout(t, err)
	testRoundtrip(t, c1)
}

// testPresentTimeout: a deadline set to now while Read and Write wait ends both.
func testPresentTimeout(t *testing.T, c1, c2 net.Conn) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(3)
	deadlineSet := make(chan bool, 1)
	go func() {
		defer wg.Done()
		time.Sleep(100 * time.Millisecond)
		deadlineSet <- true
		c1.SetReadDeadline(aLongTimeAgo)
		c1.SetWriteDeadline(aLongTimeAgo)
	}()
	go func() {
		defer wg.Done()
		n, err := c1.Read(make([]byte, 1024))
		if n != 0 {
			t.Errorf("unexpected Read count: got %d, want 0", n)
		}
		checkTimeout(t, err)
		if len(deadlineSet) == 0 {
			t.Error("Read timed out before the deadline was set")
		}
	}()
	go func() {
		defer wg.Done()
		var err error
		for err == nil {
			_, err = c1.Write(make([]byte, 1024))
		}
		checkTimeout(t, err)
	}()
}

// testFutureTimeout: a deadline ahead ends waiting Read and Write when it passes; afterwards,
// with the deadline cleared, the connection works.
func testFutureTimeout(t *testing.T, c1, c2 net.Conn) {
	var wg sync.WaitGroup
	wg.Add(2)
	c1.SetDeadline(time.Now().Add(100 * time.Millisecond))
	go func() {
		defer wg.Done()
		_, err := c1.Read(make([]byte, 1024))
		checkTimeout(t, err)
	}()
	go func() {
		defer wg.Done()
		var err error
		for err == nil {
			_, err = c1.Write(make([]byte, 1024))
		}
		checkTimeout(t, err)
	}()
	wg.Wait()
	go chunkedCopy(c2, c2)
	resyncConn(t, c1)
	testRoundtrip(t, c1)
}

// testCloseTimeout: Close ends waiting Read and Write, whatever their deadlines.
func testCloseTimeout(t *testing.T, c1, c2 net.Conn) {
	go chunkedCopy(c2, c2)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(3)
	c1.SetDeadline(neverTimeout)
	go func() {
		defer wg.Done()
		time.Sleep(100 * time.Millisecond)
		c1.Close()
	}()
	go func() {
		defer wg.Done()
		var err error
		buf := make([]byte, 1024)
		for err == nil {
			_, err = c1.Read(buf)
		}
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Read after Close: %v, want net.ErrClosed", err)
		}
	}()
	go func() {
		defer wg.Done()
		var err error
		buf := make([]byte, 1024)
		for err == nil {
			_, err = c1.Write(buf)
		}
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Write after Close: %v, want net.ErrClosed", err)
		}
	}()
}

// testConcurrentMethods: every method at once, under the race detector.
func testConcurrentMethods(t *testing.T, c1, c2 net.Conn) {
	go chunkedCopy(c2, c2)
	c1.SetDeadline(time.Now().Add(10 * time.Millisecond))
	var wg sync.WaitGroup
	for i := 0; i < 100; i++ {
		wg.Add(7)
		go func() {
			defer wg.Done()
			c1.Read(make([]byte, 1024))
		}()
		go func() {
			defer wg.Done()
			c1.Write(make([]byte, 1024))
		}()
		go func() {
			defer wg.Done()
			c1.SetDeadline(time.Now().Add(10 * time.Millisecond))
		}()
		go func() {
			defer wg.Done()
			c1.SetReadDeadline(aLongTimeAgo)
		}()
		go func() {
			defer wg.Done()
			c1.SetWriteDeadline(aLongTimeAgo)
		}()
		go func() {
			defer wg.Done()
			c1.LocalAddr()
		}()
		go func() {
			defer wg.Done()
			c1.RemoteAddr()
		}()
	}
	wg.Wait()
	resyncConn(t, c1)
	testRoundtrip(t, c1)
}

var (
	aLongTimeAgo = time.Unix(233431200, 0)
	neverTimeout = time.Time{}
)

// testRoundtrip writes something into c and reads it back (c2 echoes).
func testRoundtrip(t *testing.T, c net.Conn) {
	if err := c.SetDeadline(neverTimeout); err != nil {
		t.Errorf("roundtrip SetDeadline error: %v", err)
	}
	const s = "Hello, world!"
	buf := []byte(s)
	if _, err := c.Write(buf); err != nil {
		t.Errorf("roundtrip Write error: %v", err)
	}
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Errorf("roundtrip Read error: %v", err)
	}
	if string(buf) != s {
		t.Errorf("roundtrip data mismatch: got %q, want %q", buf, s)
	}
}

// resyncConn discards whatever earlier writes left in flight: a marker byte is echoed back once
// everything before it came back.
func resyncConn(t *testing.T, c net.Conn) {
	c.SetDeadline(neverTimeout)
	errCh := make(chan error, 1)
	go func() {
		_, err := c.Write([]byte{0xff})
		errCh <- err
	}()
	buf := make([]byte, 1024)
	for {
		n, err := c.Read(buf)
		if n > 0 && bytes.IndexByte(buf[:n], 0xff) == n-1 {
			break
		}
		if err != nil {
			t.Errorf("unexpected Read error: %v", err)
			break
		}
	}
	if err := <-errCh; err != nil {
		t.Errorf("unexpected Write error: %v", err)
	}
}

// chunkedCopy copies from r to w in chunks of random size, to exercise partial reads and writes.
func chunkedCopy(w io.Writer, r io.Reader) (int64, error) {
	b := make([]byte, 1024)
	var total int64
	for {
		n, err := r.Read(b[:1+rand.Intn(len(b)-1)])
		if n > 0 {
			m, werr := w.Write(b[:n])
			total += int64(m)
			if werr != nil {
				return total, werr
			}
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}
