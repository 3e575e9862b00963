package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lib/pq"
)

// PostgreSQL connections are bound to the contexts of the calls made on
// them. lib/pq answers a context that ends by sending the server a cancel
// request on a new connection, and leaves the call waiting for the server's
// reply: when the database does not answer at all (a link that drops
// packets, a frozen server, a proxy whose backend is gone), neither the
// cancel nor the reply ever comes, and the call, its request and a pooled
// connection wait until TCP gives up, for minutes or for ever. Here each
// call's context, for as long as the call lasts (a query until its rows are
// closed, a transaction until it ends), is watched: when it ends, the
// socket's deadline is put in the past, the call returns at once with an
// error, and lib/pq marks the connection bad, so the pool lets it go.

// openPostgres opens the pool on dsn with bound connections.
func openPostgres(dsn string) (*sql.DB, *boundConnector, error) {
	c, err := pq.NewConnector(dsn)
	if err != nil {
		return nil, nil, err
	}
	c.Dialer(dialFunc(boundDial))
	bc := &boundConnector{inner: c}
	return sql.OpenDB(bc), bc, nil
}

// dialedKey carries, in the context of a pool connection's Connect, where
// the dialer leaves the socket it made.
type dialedKey struct{}

// cancelRequestLife bounds a cancel request's connection: connecting,
// sending 16 bytes and seeing the server close it take a round trip or two.
const cancelRequestLife = time.Second

// stmtCloseTimeout bounds closing a prepared statement, which database/sql
// does without a context (and, closing the store, holding the pool's lock).
const stmtCloseTimeout = 5 * time.Second

// past is a deadline that ends every wait on a socket at once.
var past = time.Unix(1, 0)

// dialFunc is a lib/pq Dialer (and DialerContext) made of one function.
type dialFunc func(ctx context.Context, network, address string) (net.Conn, error)

func (f dialFunc) Dial(network, address string) (net.Conn, error) {
	return f(context.Background(), network, address)
}

func (f dialFunc) DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return f(ctx, network, address)
}

func (f dialFunc) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	return f(ctx, network, address)
}

// dialTCP dials as lib/pq's own dialer does.
func dialTCP(ctx context.Context, network, address string) (net.Conn, error) {
	return (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext(ctx, network, address)
}

// boundDial is the pool's dialer. A pool connection's socket is handed to
// its Connect. Any other socket carries one of lib/pq's cancel requests,
// after which lib/pq waits for the server to close it, and a prepared
// statement's call waits for that: it lives cancelRequestLife at most.
func boundDial(ctx context.Context, network, address string) (net.Conn, error) {
	c, err := dialTCP(ctx, network, address)
	if err != nil {
		return nil, err
	}
	if slot, ok := ctx.Value(dialedKey{}).(*dialed); ok {
		slot.set(c)
		return c, nil
	}
	end := time.Now().Add(cancelRequestLife)
	if d, ok := ctx.Deadline(); ok && d.Before(end) {
		end = d
	}
	_ = c.SetDeadline(end)
	return c, nil
}

// dialed is where a pool connection's socket is left while it connects.
type dialed struct {
	mu   sync.Mutex
	sock net.Conn // guarded by mu
	dead bool     // the connect's context ended; guarded by mu
}

func (d *dialed) set(c net.Conn) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sock = c
	if d.dead {
		_ = c.SetDeadline(past)
	}
}

func (d *dialed) kill() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dead = true
	if d.sock != nil {
		_ = d.sock.SetDeadline(past)
	}
}

func (d *dialed) conn() net.Conn {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.sock
}

// boundConnector makes the pool's connections.
type boundConnector struct {
	inner *pq.Connector
	// closing is set as the pool closes: its prepared statements are then
	// not closed one by one at the server (database/sql would, waiting for
	// each answer): the server drops them with the connection.
	closing atomic.Bool
}

func (c *boundConnector) Driver() driver.Driver { return c.inner.Driver() }

// Connect opens a connection: the startup exchange is bound to ctx too.
func (c *boundConnector) Connect(ctx context.Context) (driver.Conn, error) {
	d := &dialed{}
	stop := context.AfterFunc(ctx, d.kill)
	conn, err := c.inner.Connect(context.WithValue(ctx, dialedKey{}, d))
	if !stop() && err == nil {
		conn.Close()
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	sock := d.conn()
	if sock == nil { // not dialed by boundDialer: nothing to bind
		return conn, nil
	}
	return &boundConn{Conn: conn, w: watcher{sock: sock}, pool: c}, nil
}

// watcher puts its socket's deadline in the past when a watched context
// ends.
type watcher struct{ sock net.Conn }

// watch watches ctx until the returned stop is called.
func (w watcher) watch(ctx context.Context) (stop func() bool) {
	if ctx.Done() == nil {
		return func() bool { return true }
	}
	return context.AfterFunc(ctx, func() { _ = w.sock.SetDeadline(past) })
}

// boundConn is a lib/pq connection whose calls are bound to their contexts.
// It offers what lib/pq's connection offers database/sql.
type boundConn struct {
	driver.Conn
	w    watcher
	pool *boundConnector
	tx   func() bool // stops watching the open transaction's context
}

var (
	_ driver.ConnBeginTx        = (*boundConn)(nil)
	_ driver.ConnPrepareContext = (*boundConn)(nil)
	_ driver.ExecerContext      = (*boundConn)(nil)
	_ driver.QueryerContext     = (*boundConn)(nil)
	_ driver.NamedValueChecker  = (*boundConn)(nil)
	_ driver.Pinger             = (*boundConn)(nil)
	_ driver.SessionResetter    = (*boundConn)(nil)
	_ driver.Validator          = (*boundConn)(nil)
)

func (c *boundConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	stop := c.w.watch(ctx)
	defer stop()
	st, err := c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return &boundStmt{Stmt: st, w: c.w, pool: c.pool}, nil
}

func (c *boundConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	stop := c.w.watch(ctx)
	defer stop()
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
}

func (c *boundConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	stop := c.w.watch(ctx)
	rows, err := c.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
	if err != nil {
		stop()
		return nil, err
	}
	return boundRows(rows, stop), nil
}

// BeginTx watches ctx until the transaction commits or rolls back (lib/pq
// gives the connection itself as the transaction).
func (c *boundConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	stop := c.w.watch(ctx)
	tx, err := c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		stop()
		return nil, err
	}
	c.tx = stop
	return boundTx{Tx: tx, c: c}, nil
}

func (c *boundConn) Ping(ctx context.Context) error {
	stop := c.w.watch(ctx)
	defer stop()
	return c.Conn.(driver.Pinger).Ping(ctx)
}

func (c *boundConn) CheckNamedValue(nv *driver.NamedValue) error {
	return c.Conn.(driver.NamedValueChecker).CheckNamedValue(nv)
}

func (c *boundConn) ResetSession(ctx context.Context) error {
	return c.Conn.(driver.SessionResetter).ResetSession(ctx)
}

func (c *boundConn) IsValid() bool { return c.Conn.(driver.Validator).IsValid() }

// boundTx stops watching its context once it ends.
type boundTx struct {
	driver.Tx
	c *boundConn
}

func (t boundTx) end(err error) error {
	if t.c.tx != nil {
		t.c.tx()
		t.c.tx = nil
	}
	return err
}

func (t boundTx) Commit() error   { return t.end(t.Tx.Commit()) }
func (t boundTx) Rollback() error { return t.end(t.Tx.Rollback()) }

// boundStmt is a prepared statement whose calls are bound to their
// contexts.
type boundStmt struct {
	driver.Stmt
	w    watcher
	pool *boundConnector
}

var (
	_ driver.StmtExecContext  = (*boundStmt)(nil)
	_ driver.StmtQueryContext = (*boundStmt)(nil)
)

// Close closes the statement at the server, waiting stmtCloseTimeout at
// most for its answer.
func (s *boundStmt) Close() error {
	if s.pool.closing.Load() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), stmtCloseTimeout)
	defer cancel()
	stop := s.w.watch(ctx)
	defer stop()
	return s.Stmt.Close()
}

func (s *boundStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	stop := s.w.watch(ctx)
	defer stop()
	return s.Stmt.(driver.StmtExecContext).ExecContext(ctx, args)
}

func (s *boundStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	stop := s.w.watch(ctx)
	rows, err := s.Stmt.(driver.StmtQueryContext).QueryContext(ctx, args)
	if err != nil {
		stop()
		return nil, err
	}
	return boundRows(rows, stop), nil
}

// rowsOf are the optional interfaces of lib/pq's rows that database/sql
// asks for.
type rowsOf interface {
	driver.Rows
	driver.RowsNextResultSet
	driver.RowsColumnTypeScanType
	driver.RowsColumnTypeDatabaseTypeName
	driver.RowsColumnTypeLength
	driver.RowsColumnTypePrecisionScale
}

// watchedRows stops watching its query's context once closed.
type watchedRows struct {
	rowsOf
	stop func() bool
}

func boundRows(r driver.Rows, stop func() bool) driver.Rows {
	if full, ok := r.(rowsOf); ok {
		return &watchedRows{rowsOf: full, stop: stop}
	}
	return &watchedPlainRows{Rows: r, stop: stop}
}

func (r *watchedRows) Close() error {
	err := r.rowsOf.Close()
	r.stop()
	return err
}

// watchedPlainRows is watchedRows for rows that offer only driver.Rows.
type watchedPlainRows struct {
	driver.Rows
	stop func() bool
}

func (r *watchedPlainRows) Close() error {
	err := r.Rows.Close()
	r.stop()
	return err
}

// listenDialer dials the announcement listener's connections and can cut
// them: their deadlines go into the past, ending any wait on them.
type listenDialer struct {
	mu     sync.Mutex
	socks  []net.Conn // guarded by mu
	closed bool       // no more connections; guarded by mu
}

func (d *listenDialer) dial(ctx context.Context, network, address string) (net.Conn, error) {
	c, err := dialTCP(ctx, network, address)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		c.Close()
		return nil, net.ErrClosed
	}
	// The listener holds one connection at a time: the newest few are
	// the ones to cut.
	d.socks = append(d.socks[max(len(d.socks)-3, 0):], c)
	return c, nil
}

// cut ends every wait on the connections made so far, and with closed any
// made later.
func (d *listenDialer) cut(closed bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.socks {
		_ = c.SetDeadline(past)
	}
	d.socks = nil
	d.closed = d.closed || closed
}
