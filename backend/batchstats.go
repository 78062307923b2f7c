package backend

// BatchStats are the counts since it was built of a backend that batches
// operations into round trips (backend/redis: Backend.Stats): how well
// batching packs operations into round trips, and what an over-limit cache
// saves. The metrics adapters export them (Watch).
type BatchStats struct {
	// RoundTrips counts requests sent to the store (a batch, a pipeline of
	// them, or one operation), Ops the operations they carried.
	RoundTrips, Ops uint64
	// Batched counts operations that waited for a batch; Abandoned those
	// whose callers left before their batch was sent (they never ran).
	Batched, Abandoned uint64
	// BatchSizes[i] counts round trips that carried 2^i to 2^(i+1)-1
	// operations (the last, 2^7 and more).
	BatchSizes [8]uint64
	// CacheHits counts Takes the over-limit cache denied without a round
	// trip; CacheKeys is how many keys it holds now.
	CacheHits uint64
	CacheKeys int
	// PrimarySwitches counts the primary switches a backend saw
	// (backend/redis: its primary client reaching another server, a
	// failover it followed, or its server turning replica, READONLY). Keys
	// may have admitted over their limit around each one.
	PrimarySwitches uint64
}
