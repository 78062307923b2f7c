package memcached

import (
	"bytes"
	"errors"
	"strconv"
	"sync"

	"github.com/bradfitz/gomemcache/memcache"
)

// fakeClient is an in-process Client with Memcached's semantics for the
// commands the backend uses: add fails on an existing key, cas on a changed
// one, incr and decr on a missing one; incr wraps at 2^64, decr stops at
// zero, and a value that gets shorter is padded with spaces, as Memcached
// does. It never expires anything but records each item's exptime. It lets
// unit tests count calls and inject failures and interleavings; the
// integration tests run the same backend against real servers.
type fakeClient struct {
	mu    sync.Mutex
	items map[string]*fakeItem
	cas   uint64
	calls map[string]int
	// before, if set, runs before each command (without the lock held, so
	// it may call the client itself); a non-nil error is returned instead
	// of running the command.
	before func(op, key string) error
}

type fakeItem struct {
	value   []byte
	exptime int32
	cas     uint64
}

func newFakeClient() *fakeClient {
	return &fakeClient{items: map[string]*fakeItem{}, calls: map[string]int{}}
}

var _ Client = (*fakeClient)(nil)

func legalKey(key string) bool {
	if len(key) == 0 || len(key) > 250 {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] <= ' ' || key[i] == 0x7f {
			return false
		}
	}
	return true
}

// enter counts the call, runs the hook and, on success, takes the lock.
func (f *fakeClient) enter(op, key string) error {
	f.mu.Lock()
	f.calls[op]++
	hook := f.before
	f.mu.Unlock()
	if hook != nil {
		if err := hook(op, key); err != nil {
			return err
		}
	}
	if !legalKey(key) {
		return memcache.ErrMalformedKey
	}
	f.mu.Lock()
	return nil
}

func (f *fakeClient) Get(key string) (*memcache.Item, error) {
	if err := f.enter("get", key); err != nil {
		return nil, err
	}
	defer f.mu.Unlock()
	it, ok := f.items[key]
	if !ok {
		return nil, memcache.ErrCacheMiss
	}
	return &memcache.Item{Key: key, Value: bytes.Clone(it.value), Expiration: it.exptime, CasID: it.cas}, nil
}

// GetMulti is one call ("getm") fetching every key, as one round trip to one server.
func (f *fakeClient) GetMulti(keys []string) (map[string]*memcache.Item, error) {
	for _, k := range keys {
		if !legalKey(k) {
			return nil, memcache.ErrMalformedKey
		}
	}
	if err := f.enter("getm", keys[0]); err != nil {
		return nil, err
	}
	defer f.mu.Unlock()
	m := map[string]*memcache.Item{}
	for _, key := range keys {
		if it, ok := f.items[key]; ok {
			m[key] = &memcache.Item{Key: key, Value: bytes.Clone(it.value), Expiration: it.exptime, CasID: it.cas}
		}
	}
	return m, nil
}

func (f *fakeClient) store(item *memcache.Item) {
	f.cas++
	f.items[item.Key] = &fakeItem{value: bytes.Clone(item.Value), exptime: item.Expiration, cas: f.cas}
}

func (f *fakeClient) Add(item *memcache.Item) error {
	if err := f.enter("add", item.Key); err != nil {
		return err
	}
	defer f.mu.Unlock()
	if _, ok := f.items[item.Key]; ok {
		return memcache.ErrNotStored
	}
	f.store(item)
	return nil
}

func (f *fakeClient) CompareAndSwap(item *memcache.Item) error {
	if err := f.enter("cas", item.Key); err != nil {
		return err
	}
	defer f.mu.Unlock()
	it, ok := f.items[item.Key]
	if !ok {
		return memcache.ErrCacheMiss
	}
	if it.cas != item.CasID {
		return memcache.ErrCASConflict
	}
	f.store(item)
	return nil
}

func (f *fakeClient) Increment(key string, delta uint64) (uint64, error) {
	return f.delta("incr", key, func(v uint64) uint64 { return v + delta })
}

func (f *fakeClient) Decrement(key string, delta uint64) (uint64, error) {
	return f.delta("decr", key, func(v uint64) uint64 {
		if delta > v {
			return 0
		}
		return v - delta
	})
}

func (f *fakeClient) delta(op, key string, apply func(uint64) uint64) (uint64, error) {
	if err := f.enter(op, key); err != nil {
		return 0, err
	}
	defer f.mu.Unlock()
	it, ok := f.items[key]
	if !ok {
		return 0, memcache.ErrCacheMiss
	}
	v, err := strconv.ParseUint(string(bytes.TrimRight(it.value, " ")), 10, 64)
	if err != nil {
		return 0, errors.New("memcache: client error: cannot increment or decrement non-numeric value")
	}
	v = apply(v)
	s := strconv.AppendUint(nil, v, 10)
	if len(s) < len(it.value) {
		s = append(s, bytes.Repeat([]byte(" "), len(it.value)-len(s))...)
	}
	it.value = s
	f.cas++
	it.cas = f.cas
	return v, nil
}

// set stores a value directly, as another program writing to the server would.
func (f *fakeClient) set(key, value string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.store(&memcache.Item{Key: key, Value: []byte(value)})
}

// value returns an item's value and whether it exists.
func (f *fakeClient) value(key string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	it, ok := f.items[key]
	if !ok {
		return "", false
	}
	return string(it.value), true
}

// exptimeOf returns an item's stored exptime.
func (f *fakeClient) exptimeOf(key string) int32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if it, ok := f.items[key]; ok {
		return it.exptime
	}
	return -1
}

func (f *fakeClient) evict(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.items, key)
}

// callCounts returns the calls made so far, by command, and resets them.
func (f *fakeClient) callCounts() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = map[string]int{}
	return c
}

func (f *fakeClient) setBefore(h func(op, key string) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.before = h
}
