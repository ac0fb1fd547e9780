// Package nstest gives sluice's real-kernel tests network namespaces of their own, the same
// way everywhere: made with lo up, entered on a locked OS thread, and removed at the test's
// cleanup, pass or fail; and the root check and the plain server their traffic reaches. It
// is for tests only.
package nstest

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// NeedRoot skips the test unless it runs as root, saying what needs it.
func NeedRoot(t testing.TB, what string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("%s needs root", what)
	}
}

// Lock locks the test's goroutine to its OS thread, which the test may then move between
// network namespaces (Another, Set). At cleanup the thread goes back to the test's own
// namespace and is unlocked; one that cannot go back stays locked, and the runtime ends it
// with the goroutine.
func Lock(t testing.TB) {
	t.Helper()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("getting the test's network namespace: %v", err)
	}
	t.Cleanup(func() {
		defer orig.Close()
		if err := netns.Set(orig); err != nil {
			t.Errorf("returning to the test's network namespace: %v", err)
			return
		}
		runtime.UnlockOSThread()
	})
}

// Another moves the test's thread, locked by Lock, into a new network namespace with lo up,
// and returns it; its handle is closed at cleanup.
func Another(t testing.TB) netns.NsHandle {
	t.Helper()
	ns, err := netns.New() // the thread is now in ns
	if err != nil {
		t.Fatalf("creating a network namespace: %v", err)
	}
	t.Cleanup(func() { ns.Close() })
	if err := loUp(); err != nil {
		t.Fatal(err)
	}
	return ns
}

// Enter is Lock then Another: the rest of the test runs in a namespace of its own.
func Enter(t testing.TB) netns.NsHandle {
	t.Helper()
	Lock(t)
	return Another(t)
}

// Set moves the test's thread, locked by Lock, into ns.
func Set(t testing.TB, ns netns.NsHandle) {
	t.Helper()
	if err := netns.Set(ns); err != nil {
		t.Fatalf("entering a network namespace: %v", err)
	}
}

// New makes a network namespace with lo up, held only by the returned handle: the thread
// that made it ends at once, and the namespace, its links and routes go when the handle is
// closed at cleanup. Work in it with Run or a netlink handle (netlink.NewHandleAt).
func New(t testing.TB) netns.NsHandle {
	t.Helper()
	type made struct {
		ns  netns.NsHandle
		err error
	}
	ch := make(chan made, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread, now in the new namespace, ends here
		ns, err := netns.New()
		if err == nil {
			err = loUp()
		}
		ch <- made{ns, err}
	}()
	m := <-ch
	if m.err != nil {
		if m.ns.IsOpen() {
			m.ns.Close()
		}
		t.Fatalf("creating a network namespace: %v", m.err)
	}
	t.Cleanup(func() { m.ns.Close() })
	return m.ns
}

// Run runs f on a thread of its own in ns and returns its error. The thread is never
// unlocked: it ends with its goroutine, so nothing else ever runs in ns by accident.
func Run(ns netns.NsHandle, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("entering a network namespace: %w", err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

func loUp() error {
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("setting lo up: %w", err)
	}
	return nil
}

// Greet serves ln until it is closed at the test's cleanup: each connection gets greeting
// (none when empty) and is closed; each peer's address goes to accepted when it is not nil.
// It is the server a real-kernel test's traffic reaches.
func Greet(t testing.TB, ln net.Listener, greeting string, accepted chan<- net.Addr) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if accepted != nil {
				accepted <- c.RemoteAddr()
			}
			if greeting != "" {
				_, _ = c.Write([]byte(greeting))
			}
			c.Close()
		}
	}()
}
