// Package flags routes each rate-limit key to an old or a new backend by a
// percentage that changes at run time, so a migration between stores can be
// ramped up and rolled back without a deploy.
//
// A Rollout decides per key; this package has a static percentage (Percent)
// and a JSON file an operator edits (File). An Unleash feature flag is the
// third source, in package flags/unleash, so that a program using the first
// two compiles in no Unleash client. All three put a key in the same
// percentile bucket as Unleash's flexibleRollout strategy (see Bucket), so
// switching sources does not reshuffle clients, and raising the percentage
// only ever adds keys.
//
// Router is a throttler.Backend that sends Take, Peek and Refund for a key to
// the backend the key maps to at call time:
//
//	pct, _ := flags.NewPercent(0)
//	router, err := flags.NewRouter(memcachedBackend, redisBackend, pct, nil)
//	if err != nil {
//		return err
//	}
//	pct.Set(25) // a quarter of the keys move to redis on their next call
//	pct.Set(0)  // rollback: every key is back on memcached
//
// Package migration builds a Router whose rollout also sends the keys a
// change of percentage is moving to both stores at once.
package flags
