package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// refKind is a kind of object the admin commands name on the command line:
// by its id, or by its human name (an account's label, a key's name).
type refKind struct {
	noun   string // "account"
	nameIs string // what its human name is called: "label"
	prefix string // how its ids begin: "acc_"
	list   func(ctx context.Context, api *apiClient) ([]namedRef, error)
}

// namedRef is one object as the resolver sees it: its id and human name.
type namedRef struct {
	ID, Name string
}

var (
	accountRef = refKind{noun: "account", nameIs: "label", prefix: "acc_", list: func(ctx context.Context, api *apiClient) ([]namedRef, error) {
		accts, _, err := listAccounts(ctx, api)
		refs := make([]namedRef, len(accts))
		for i, a := range accts {
			refs[i] = namedRef{a.ID, a.Label}
		}
		return refs, err
	}}
	keyRef = refKind{noun: "client key", nameIs: "name", prefix: "key_", list: func(ctx context.Context, api *apiClient) ([]namedRef, error) {
		keys, _, err := listKeys(ctx, api)
		refs := make([]namedRef, len(keys))
		for i, k := range keys {
			refs[i] = namedRef{k.ID, k.Name}
		}
		return refs, err
	}}
)

// help is what a command's -help says of how it reads a reference to kind.
func (k refKind) help() string {
	return fmt.Sprintf(`The %[1]s is given by its id (%[2]s...) or its %[3]s: an exact id first, then
the exact %[3]s, then the %[3]s in any case if only one %[1]s has it. A %[3]s
that several %[1]ss share is refused, with their ids.`, k.noun, k.prefix, k.nameIs)
}

// resolveMode says what a reference to no object means.
type resolveMode int

const (
	// mustExist: the command acts on the object, which must exist.
	mustExist resolveMode = iota
	// mayBeGone: the reference filters a record that outlives its objects
	// (the request log keeps the ids of accounts since removed): an
	// unknown reference written as an id (acc_..., key_...) is taken as
	// that id.
	mayBeGone
)

// resolve returns the ids that refs name among the objects of kind, in the
// same order: the admin commands' one way to read an account or key from
// the command line. It asks the API for the objects once, and only when
// there is a reference to resolve. Blank references resolve to "".
func (a *apiClient) resolve(ctx context.Context, kind refKind, mode resolveMode, refs ...string) ([]string, error) {
	ids := make([]string, len(refs))
	var objects []namedRef
	listed := false
	for i, ref := range refs {
		if strings.TrimSpace(ref) == "" {
			continue
		}
		if !listed {
			var err error
			if objects, err = kind.list(ctx, a); err != nil {
				return nil, err
			}
			listed = true
		}
		var err error
		if ids[i], err = pickRef(kind, mode, objects, ref); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// resolveOne is resolve of a single reference.
func (a *apiClient) resolveOne(ctx context.Context, kind refKind, mode resolveMode, ref string) (string, error) {
	ids, err := a.resolve(ctx, kind, mode, ref)
	if err != nil {
		return "", err
	}
	return ids[0], nil
}

// pickRef finds the object ref names among objects: the one whose id is
// ref; else the one whose name is ref exactly; else the one whose name is
// ref but for case. No object, or several, is an error that names them
// (by id order).
func pickRef(kind refKind, mode resolveMode, objects []namedRef, ref string) (string, error) {
	ref = strings.TrimSpace(ref)
	for _, o := range objects {
		if o.ID == ref {
			return o.ID, nil
		}
	}
	for _, same := range []func(a, b string) bool{
		func(a, b string) bool { return a == b },
		strings.EqualFold,
	} {
		var matches []namedRef
		for _, o := range objects {
			if same(o.Name, ref) {
				matches = append(matches, o)
			}
		}
		switch len(matches) {
		case 0:
			continue
		case 1:
			return matches[0].ID, nil
		}
		slices.SortFunc(matches, func(a, b namedRef) int { return strings.Compare(a.ID, b.ID) })
		list := make([]string, len(matches))
		for i, m := range matches {
			list[i] = fmt.Sprintf("%s (%s %q)", m.ID, kind.nameIs, m.Name)
		}
		return "", fmt.Errorf("%d %ss match the %s %q: %s; give the id", len(matches), kind.noun, kind.nameIs, ref, strings.Join(list, ", "))
	}
	if mode == mayBeGone && strings.HasPrefix(ref, kind.prefix) {
		return ref, nil
	}
	return "", fmt.Errorf("no %s with id or %s %q", kind.noun, kind.nameIs, ref)
}
