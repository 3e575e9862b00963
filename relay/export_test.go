package relay

import "context"

// SettleWrites waits until the records the relay writes behind its
// requests (request log rows, bindings it retries, usage windows the
// answers reported, key use) are written, or ctx ends: a test that writes
// the same rows itself does so after them, not raced by them.
func (s *Server) SettleWrites(ctx context.Context) error {
	for _, flush := range []func(context.Context) error{s.requestLog.flush, s.placements.flush, s.usage.flush, s.keyUse.flush} {
		if err := flush(ctx); err != nil {
			return err
		}
	}
	return nil
}
