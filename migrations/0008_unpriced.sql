-- +goose Up

-- A request whose model the price table does not price (issue 33) is priced
-- by the table's fallback model, and says so: unpriced is 1 then, so
-- reports can tell a cost that stands in for a price from a price. A price
-- table names its fallback model ('' for none: such models then cost
-- nothing).
ALTER TABLE requests ADD COLUMN unpriced INTEGER NOT NULL DEFAULT 0;
ALTER TABLE price_tables ADD COLUMN fallback_model TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE price_tables DROP COLUMN fallback_model;
ALTER TABLE requests DROP COLUMN unpriced;
