package roles

import "testing"

func TestCovers(t *testing.T) {
	for _, tc := range []struct {
		have, need Role
		want       bool
	}{
		{Viewer, Viewer, true}, {Viewer, Operator, false}, {Viewer, Admin, false},
		{Operator, Viewer, true}, {Operator, Operator, true}, {Operator, Admin, false},
		{Admin, Viewer, true}, {Admin, Operator, true}, {Admin, Admin, true},
		{"", Viewer, false}, {"root", Viewer, false}, {Admin, "", false}, {Admin, "root", false},
	} {
		if got := tc.have.Covers(tc.need); got != tc.want {
			t.Errorf("%q covers %q = %v, want %v", tc.have, tc.need, got, tc.want)
		}
	}
}

func TestEffective(t *testing.T) {
	for _, tc := range []struct{ user, token, want Role }{
		{Admin, "", Admin}, {Admin, Viewer, Viewer}, {Admin, Operator, Operator},
		{Viewer, Admin, Viewer}, {Operator, Admin, Operator}, {Operator, Viewer, Viewer}, {Viewer, Viewer, Viewer},
	} {
		if got := Effective(tc.user, tc.token); got != tc.want {
			t.Errorf("Effective(%q, %q) = %q, want %q", tc.user, tc.token, got, tc.want)
		}
	}
}

func TestParse(t *testing.T) {
	for _, r := range All {
		if got, err := Parse(string(r)); err != nil || got != r {
			t.Errorf("Parse(%q) = %q, %v", r, got, err)
		}
	}
	for _, s := range []string{"", "Admin", "root", " viewer"} {
		if _, err := Parse(s); err == nil {
			t.Errorf("Parse(%q) accepted", s)
		}
	}
}
