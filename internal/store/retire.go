package store

import (
	"context"
	"fmt"
	"strings"
)

// RetireOwner abandons a hard raw-session binding for the process-session
// interpretation, as a compare-and-set: only while the row still names
// owner, is not yet abandoned, and the owner's status is one of unavailable.
// A concurrent recovery (the account active again) or owner change wins:
// RetireOwner then reports false and changes nothing. scope records the
// interpretation and the source, e.g. "process_session:goal_restart".
func (s *Store) RetireOwner(ctx context.Context, bindingID, owner string, unavailable []Status, scope string) (bool, error) {
	if len(unavailable) == 0 {
		return false, fmt.Errorf("retire owner: no unavailable statuses given")
	}
	marks := strings.TrimSuffix(strings.Repeat("?, ", len(unavailable)), ", ")
	args := []any{scope, s.now().UnixMilli(), bindingID, owner, string(BindRawSession)}
	for _, st := range unavailable {
		args = append(args, string(st))
	}
	res, err := s.exec(ctx, `UPDATE bindings SET abandoned_scope = ?, last_seen_at = ?
		WHERE id = ? AND account_id = ? AND kind = ? AND abandoned_scope IS NULL
		AND EXISTS (SELECT 1 FROM accounts WHERE accounts.id = bindings.account_id AND accounts.status IN (`+marks+`))`, args...)
	if err != nil {
		return false, fmt.Errorf("retire owner: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("retire owner: %w", err)
	}
	return n == 1, nil
}
