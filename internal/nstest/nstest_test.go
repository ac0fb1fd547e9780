package nstest

import (
	"net"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// TestNamespaces: Enter, Another and New each give a namespace of its own with lo up (a
// listener on 127.0.0.1 in one is not seen from another), Run works in the one it is given,
// and after Enter's cleanup the test's thread is back in the test's own namespace.
func TestNamespaces(t *testing.T) {
	NeedRoot(t, "making network namespaces")
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	listen := func() (net.Listener, error) { return net.Listen("tcp4", "127.0.0.1:0") }
	t.Run("enter", func(t *testing.T) {
		// Registered before Enter's, so it runs after it: the thread is back by then.
		t.Cleanup(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			here, err := netns.Get()
			if err != nil {
				t.Error(err)
				return
			}
			defer here.Close()
			if !here.Equal(orig) {
				t.Error("after the cleanup the thread is not back in the test's namespace")
			}
		})
		a := Enter(t)
		ln, err := listen()
		if err != nil {
			t.Fatalf("listening on lo in a new namespace (lo up?): %v", err)
		}
		defer ln.Close()
		b := Another(t)
		if a.Equal(b) {
			t.Fatal("Another gave the same namespace")
		}
		if c, err := net.Dial("tcp4", ln.Addr().String()); err == nil {
			c.Close()
			t.Fatal("a listener of the first namespace is reachable from the second")
		}
		Set(t, a)
		c, err := net.Dial("tcp4", ln.Addr().String())
		if err != nil {
			t.Fatalf("back in the first namespace: %v", err)
		}
		c.Close()
	})
	t.Run("new and run", func(t *testing.T) {
		ns := New(t)
		err := Run(ns, func() error {
			here, err := netns.Get()
			if err != nil {
				return err
			}
			defer here.Close()
			if !here.Equal(ns) {
				t.Error("Run's function is not in the namespace given")
			}
			lo, err := netlink.LinkByName("lo")
			if err != nil {
				return err
			}
			if lo.Attrs().Flags&net.FlagUp == 0 {
				t.Error("lo is down in New's namespace")
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}
