// Package nlutil holds what sluice's netlink users share beyond the netlink library.
package nlutil

import (
	"errors"

	"github.com/vishvananda/netlink"
)

// DumpAgain runs a netlink dump again when the kernel says its objects changed during it
// (ErrDumpInterrupted: a workload's interface appearing, say), up to five times: an apply must
// not fail over a list that is merely out of date.
func DumpAgain[T any](dump func() (T, error)) (T, error) {
	v, err := dump()
	for try := 0; errors.Is(err, netlink.ErrDumpInterrupted) && try < 5; try++ {
		v, err = dump()
	}
	return v, err
}
