package shed

import "net/http"

// Classifier is the classification Middleware builds from o.
func Classifier(o *Options) (func(*http.Request) Class, error) { return classifier(o) }
