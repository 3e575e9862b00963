package ui

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"strconv"
	"strings"
)

// Static holds the console's stylesheet and script, served under
// /admin/static/.
//
//go:embed static
var static embed.FS

// Static is the content of /admin/static/.
func Static() fs.FS {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embed directive guarantees the folder
	}
	return sub
}

// assetVersion changes when a static file does, so pages can let browsers
// cache the files for long.
var assetVersion = func() string {
	h := sha256.New()
	entries, _ := fs.ReadDir(static, "static")
	for _, e := range entries {
		b, _ := fs.ReadFile(static, "static/"+e.Name())
		h.Write([]byte(e.Name()))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}()

func asset(name string) string { return "/admin/static/" + name + "?v=" + assetVersion }

func num[T ~int | ~int64](n T) string { return strconv.FormatInt(int64(n), 10) }

// plural is one or many, as n says.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func join(names []string) string { return strings.Join(names, ", ") }

// nav is the console's navigation, in order.
var nav = []struct{ Key, Label, URL string }{
	{"overview", "Overview", "/admin/"},
	{"accounts", "Accounts", "/admin/accounts"},
	{"bindings", "Bindings", "/admin/bindings"},
	{"lanes", "Lanes", "/admin/lanes"},
	{"diagnostics", "Diagnostics", "/admin/diagnostics"},
	{"requests", "Requests", "/admin/requests"},
	{"usage", "Usage", "/admin/usage"},
	{"keys", "Client keys", "/admin/keys"},
	{"webhooks", "Webhooks", "/admin/webhooks"},
	{"audit", "Audit log", "/admin/audit"},
	{"people", "People", "/admin/people"},
	{"settings", "Settings", "/admin/settings"},
}
