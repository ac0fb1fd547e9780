package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
)

// cpioWriter writes a "newc" cpio archive, the format the kernel unpacks into its rootfs.
// Directories are written before what they hold (the kernel creates nothing implicitly: a
// file whose directory is missing is dropped without a word), each path at most once.
type cpioWriter struct {
	w    *bufio.Writer
	ino  uint32
	seen map[string]bool
}

func newCPIOWriter(w io.Writer) *cpioWriter {
	return &cpioWriter{w: bufio.NewWriterSize(w, 1<<20), ino: 1, seen: map[string]bool{}}
}

const (
	cpioDir     = 0o040000
	cpioFile    = 0o100000
	cpioSymlink = 0o120000
	cpioChar    = 0o020000
)

// header writes one entry's header and name; size bytes of data must follow.
func (c *cpioWriter) header(name string, mode uint32, size int, rdevMajor, rdevMinor uint32) error {
	c.ino++
	_, err := fmt.Fprintf(c.w, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, size, 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	if err != nil {
		return err
	}
	if _, err := c.w.WriteString(name + "\x00"); err != nil {
		return err
	}
	return c.pad(110 + len(name) + 1)
}

func (c *cpioWriter) pad(n int) error {
	if r := n % 4; r != 0 {
		_, err := c.w.Write(make([]byte, 4-r))
		return err
	}
	return nil
}

// clean turns an absolute or relative path into the archive's form ("usr/bin/ip").
func cpioName(p string) string { return strings.TrimPrefix(path.Clean("/"+p), "/") }

// dirs writes every missing parent directory of name.
func (c *cpioWriter) dirs(name string) error {
	dir := path.Dir(name)
	if dir == "." || c.seen[dir] {
		return nil
	}
	return c.Dir(dir)
}

// claim names p in the archive, adds its parent directories and marks it added. When p is
// there already it reports it as done (again: true), or, for a file, an error.
func (c *cpioWriter) claim(p string, file bool) (name string, again bool, err error) {
	name = cpioName(p)
	if c.seen[name] {
		if file {
			return name, true, fmt.Errorf("cpio: %s added twice", name)
		}
		return name, true, nil
	}
	if err := c.dirs(name); err != nil {
		return name, false, err
	}
	c.seen[name] = true
	return name, false, nil
}

// Dir adds a directory (and its parents).
func (c *cpioWriter) Dir(p string) error {
	name, again, err := c.claim(p, false)
	if again || err != nil {
		return err
	}
	return c.header(name, cpioDir|0o755, 0, 0, 0)
}

// Bytes adds a regular file with the given content and permissions.
func (c *cpioWriter) Bytes(p string, data []byte, perm uint32) error {
	name, _, err := c.claim(p, true)
	if err != nil {
		return err
	}
	if err := c.header(name, cpioFile|perm, len(data), 0, 0); err != nil {
		return err
	}
	if _, err := c.w.Write(data); err != nil {
		return err
	}
	return c.pad(len(data))
}

// File adds the host file src (symbolic links followed) at p, keeping its permissions.
func (c *cpioWriter) File(p, src string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	name, _, err := c.claim(p, true)
	if err != nil {
		return err
	}
	if err := c.header(name, cpioFile|uint32(st.Mode().Perm()), int(st.Size()), 0, 0); err != nil {
		return err
	}
	n, err := io.Copy(c.w, f)
	if err != nil {
		return err
	}
	if n != st.Size() {
		return fmt.Errorf("cpio: %s changed while it was being read", src)
	}
	return c.pad(int(n))
}

// Symlink adds a symbolic link p pointing at target.
func (c *cpioWriter) Symlink(p, target string) error {
	name, again, err := c.claim(p, false)
	if again || err != nil {
		return err
	}
	if err := c.header(name, cpioSymlink|0o777, len(target), 0, 0); err != nil {
		return err
	}
	if _, err := c.w.WriteString(target); err != nil {
		return err
	}
	return c.pad(len(target))
}

// CharDev adds a character device node.
func (c *cpioWriter) CharDev(p string, perm, major, minor uint32) error {
	name := cpioName(p)
	if err := c.dirs(name); err != nil {
		return err
	}
	c.seen[name] = true
	return c.header(name, cpioChar|perm, 0, major, minor)
}

// Has reports whether p is in the archive already.
func (c *cpioWriter) Has(p string) bool { return c.seen[cpioName(p)] }

// Close writes the trailer and flushes; the underlying writer stays open.
func (c *cpioWriter) Close() error {
	if err := c.header("TRAILER!!!", 0, 0, 0, 0); err != nil {
		return err
	}
	return c.w.Flush()
}
