module github.com/throttlekit/throttlekit/benchmarks

go 1.26.8

replace github.com/throttlekit/throttlekit => ../

require (
	github.com/sethvargo/go-limiter v0.7.1
	github.com/throttlekit/throttlekit v0.0.0-00010101000000-000000000000
	golang.org/x/time v0.16.0
)
