// meshgo-echo: a small echo server and client over rdmamesh channels, with the Go binding.
//
//	meshgo-echo -l 6000                 # on node 2: echo every channel to port 6000
//	echo hello | meshgo-echo 2:6000     # on node 1: send stdin, print what comes back
//
// -s SOCKET names meshd's control socket (default $MESH_SOCKET, then /run/meshd/meshd.sock).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"time"

	"rdmamesh/mesh"
)

func main() {
	listen := flag.String("l", "", "listen on this port and echo every channel")
	socket := flag.String("s", "", "meshd's control socket")
	timeout := flag.Duration("t", 30*time.Second, "dial timeout")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: %s [-s SOCKET] -l PORT | [-s SOCKET] [-t TIMEOUT] NODE:PORT\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("meshgo-echo: ")

	if *listen != "" {
		lc := mesh.ListenConfig{Socket: *socket}
		l, err := lc.Listen(context.Background(), "mesh", ":"+*listen)
		if err != nil {
			log.Fatal(err)
		}
		log.Printf("listening on %v", l.Addr())
		for {
			c, err := l.Accept()
			if err != nil {
				log.Fatal(err)
			}
			go echo(c)
		}
	}
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(1)
	}
	d := mesh.Dialer{Socket: *socket, Timeout: *timeout}
	c, err := d.Dial("mesh", flag.Arg(0))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	errc := make(chan error, 1)
	go func() {
		_, err := io.Copy(c, os.Stdin)
		if err == nil {
			err = c.(*mesh.Conn).CloseWrite() // the server sees EOF, echoes the rest, closes
		}
		errc <- err
	}()
	if _, err := io.Copy(os.Stdout, c); err != nil {
		log.Fatal(err)
	}
	if err := <-errc; err != nil {
		log.Fatal(err)
	}
}

// echo copies a channel back to itself until EOF, then closes it.
func echo(c net.Conn) {
	defer c.Close()
	n, err := io.Copy(c, c)
	if err != nil {
		log.Printf("%v: %v after %d bytes", c.RemoteAddr(), err, n)
		return
	}
	log.Printf("%v: echoed %d bytes", c.RemoteAddr(), n)
}
