// Package roles is the relay's access policy: three roles in order, viewer
// < operator < admin, each allowed what the ones below it are and more.
// Which role a route needs is declared with the route (package web); this
// package only says which role covers which.
package roles

import "fmt"

// Role is what a person (or a token) may do. The zero Role is no role: it
// covers nothing.
type Role string

const (
	// Viewer reads everything the console and the API show, except
	// credentials and other people's tokens.
	Viewer Role = "viewer"
	// Operator also acts on threads and traffic: binding resets, pins,
	// account pause and resume, client keys, usage exports.
	Operator Role = "operator"
	// Admin also manages accounts and their credentials, users, settings
	// and prices. The admin token acts as an admin.
	Admin Role = "admin"
)

// All lists the roles, lowest first.
var All = []Role{Viewer, Operator, Admin}

func (r Role) rank() int {
	switch r {
	case Viewer:
		return 1
	case Operator:
		return 2
	case Admin:
		return 3
	}
	return 0
}

// Valid reports whether r is one of the three roles.
func (r Role) Valid() bool { return r.rank() > 0 }

// Covers reports whether r may do what needs the role need. No role covers
// anything, and nothing is covered by an unknown need.
func (r Role) Covers(need Role) bool { return r.Valid() && need.Valid() && r.rank() >= need.rank() }

// Parse reads a role's name.
func Parse(s string) (Role, error) {
	if r := Role(s); r.Valid() {
		return r, nil
	}
	return "", fmt.Errorf("unknown role %q: one of viewer, operator, admin", s)
}

// Effective is the role a token acts with: its user's role, narrowed to
// the token's own when it has one (""). A token never widens its user.
func Effective(user, token Role) Role {
	if token == "" || user.rank() <= token.rank() {
		return user
	}
	return token
}
