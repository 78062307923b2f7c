// Package flags routes each rate-limit key to an old or a new backend by a
// percentage that changes at run time, so a migration between stores can be
// ramped up and rolled back without a deploy.
//
// A Rollout decides per key; the sources are a static percentage (Percent),
// a JSON file an operator edits (File) and an Unleash feature flag (Unleash).
// All three put a key in the same percentile bucket as Unleash's
// flexibleRollout strategy (see Bucket), so switching sources does not
// reshuffle clients, and raising the percentage only ever adds keys.
//
// Router is a throttler.Backend that sends Take, Peek and Refund for a key to
// the backend the key maps to at call time:
//
//	pct := flags.NewPercent(0)
//	b := flags.NewRouter(memcachedBackend, redisBackend, pct, nil)
//	pct.Set(25) // a quarter of the keys move to redis on their next call
//	pct.Set(0)  // rollback: every key is back on memcached
package flags
