package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
)

func TestAuditLog(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, c *clock) {
		ctx := context.Background()
		first, err := s.RecordAudit(ctx, store.AuditEntry{Actor: "admin", Address: "127.0.0.1", Action: "login"})
		require.NoError(t, err)
		assert.True(t, strings.HasPrefix(first.ID, "aud_"))
		assert.True(t, first.At.Equal(c.Now()), "the time defaults to the store's clock")
		c.Add(time.Second)
		_, err = s.RecordAudit(ctx, store.AuditEntry{Actor: "admin", Address: "127.0.0.1", Action: "binding.reset", Target: "thread:t1", Detail: "2 bindings reset"})
		require.NoError(t, err)
		c.Add(time.Second)
		_, err = s.RecordAudit(ctx, store.AuditEntry{Actor: "api", Address: "10.0.0.2", Action: "binding.pin", Target: "session:s1"})
		require.NoError(t, err)
		c.Add(time.Second)
		_, err = s.RecordAudit(ctx, store.AuditEntry{Actor: "api", Action: "bindings.export"}) // shares no prefix with "binding."
		require.NoError(t, err)

		all, total, err := s.AuditLog(ctx, store.AuditFilter{})
		require.NoError(t, err)
		assert.Equal(t, 4, total)
		require.Len(t, all, 4)
		assert.Equal(t, "bindings.export", all[0].Action, "newest first")
		assert.Equal(t, "login", all[3].Action)
		assert.Equal(t, "thread:t1", all[2].Target)
		assert.Equal(t, "2 bindings reset", all[2].Detail)
		assert.Equal(t, "127.0.0.1", all[2].Address)

		got, total, err := s.AuditLog(ctx, store.AuditFilter{Action: "binding."})
		require.NoError(t, err)
		assert.Equal(t, 2, total, "a trailing dot filters by prefix")
		for _, e := range got {
			assert.True(t, strings.HasPrefix(e.Action, "binding."), e.Action)
		}
		got, total, err = s.AuditLog(ctx, store.AuditFilter{Action: "binding.reset"})
		require.NoError(t, err)
		assert.Equal(t, 1, total)
		assert.Equal(t, "thread:t1", got[0].Target)
		_, total, err = s.AuditLog(ctx, store.AuditFilter{Actor: "api"})
		require.NoError(t, err)
		assert.Equal(t, 2, total)
		_, total, err = s.AuditLog(ctx, store.AuditFilter{Target: "session:s1"})
		require.NoError(t, err)
		assert.Equal(t, 1, total)

		page, total, err := s.AuditLog(ctx, store.AuditFilter{Limit: 2, Offset: 2})
		require.NoError(t, err)
		assert.Equal(t, 4, total)
		require.Len(t, page, 2)
		assert.Equal(t, "binding.reset", page[0].Action)

		_, err = s.RecordAudit(ctx, store.AuditEntry{Action: "x"})
		assert.Error(t, err, "an entry names its actor")
	})
}
