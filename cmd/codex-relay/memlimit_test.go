package main

import (
	"io/fs"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSoftMemoryLimit(t *testing.T) {
	t.Parallel()
	files := func(m map[string]string) func(string) ([]byte, error) {
		return func(path string) ([]byte, error) {
			if v, ok := m[path]; ok {
				return []byte(v), nil
			}
			return nil, fs.ErrNotExist
		}
	}
	noEnv := func(string) string { return "" }
	cases := []struct {
		name  string
		env   string
		files map[string]string
		want  int64
	}{
		{"cgroup v2 limit", "", map[string]string{cgroupV2MemoryMax: "536870912\n"}, 536870912 - 53687091},
		{"cgroup v2 without a limit", "", map[string]string{cgroupV2MemoryMax: "max\n", cgroupV1MemoryMax: "1000"}, 0},
		{"cgroup v1 limit", "", map[string]string{cgroupV1MemoryMax: "1073741824\n"}, 1073741824 - 107374182},
		{"cgroup v1 without a limit", "", map[string]string{cgroupV1MemoryMax: "9223372036854771712\n"}, 0},
		{"no cgroup files", "", nil, 0},
		{"unreadable value", "", map[string]string{cgroupV2MemoryMax: "lots"}, 0},
		{"GOMEMLIMIT set: the operator's", "400MiB", map[string]string{cgroupV2MemoryMax: "536870912"}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			getenv := noEnv
			if tc.env != "" {
				getenv = func(k string) string {
					if k == "GOMEMLIMIT" {
						return tc.env
					}
					return ""
				}
			}
			assert.Equal(t, tc.want, softMemoryLimit(getenv, files(tc.files)))
		})
	}
}
