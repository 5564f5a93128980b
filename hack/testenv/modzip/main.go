// Command modzip writes a Go module's zip from a tag of its Git repository, with the
// same rules as the Go module proxy (golang.org/x/mod/zip.CreateFromVCS), for a module
// version the proxy lists but refuses to serve. The go command then checks the zip
// against go.sum's hash from the checksum database, so nothing unverified is built.
//
//	modzip REPO REVISION SUBDIR MODULE VERSION OUT.zip
package main

import (
	"fmt"
	"os"

	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

func main() {
	if len(os.Args) != 7 {
		fmt.Fprintln(os.Stderr, "usage: modzip REPO REVISION SUBDIR MODULE VERSION OUT.zip")
		os.Exit(2)
	}
	repo, rev, subdir, path, version, out := os.Args[1], os.Args[2], os.Args[3], os.Args[4], os.Args[5], os.Args[6]
	f, err := os.Create(out + ".tmp")
	if err == nil {
		err = zip.CreateFromVCS(f, module.Version{Path: path, Version: version}, repo, rev, subdir)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		err = os.Rename(out+".tmp", out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "modzip:", err)
		os.Exit(1)
	}
}
