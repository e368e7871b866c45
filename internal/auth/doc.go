// Package auth is who may call the services: bearer JWTs verified against
// a JWKS, as with any OIDC provider, and a dev issuer that serves one.
//
// A Verifier checks a token's signature against the keys of AUTH_JWKS_URL
// (fetched once, refreshed on an interval, and again when a token names a
// key it has not seen, so a provider's key rotation needs no restart), its
// issuer, audience and validity times, and turns it into an Identity: the
// subject is the customer, a role "admin" makes an operator. Its Middleware
// puts the Identity on every request of an echo server but the public
// ones, and answers 401 with WWW-Authenticate: Bearer otherwise. The crypto
// is github.com/golang-jwt/jwt/v5's; the key set github.com/MicahParks/keyfunc
// and jwkset's.
//
// Issuer is the dev identity provider behind `onceflow dev` and `onceflow
// issuer`: a signing key made at start, its JWKS, and a token endpoint that
// signs whatever customer it is asked for, and an operator (role admin)
// only for a caller that presents the run's operator secret; the endpoint
// answers only its own host names (DNS rebinding). It is for development
// and tests only: anyone who reaches it is any customer they like.
package auth
