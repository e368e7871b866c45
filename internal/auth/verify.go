package auth

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/time/rate"
)

// RoleAdmin is the role that makes a caller an operator.
const RoleAdmin = "admin"

// DefaultAudience is the audience of the dev issuer's tokens and the
// services' default AUTH_AUDIENCE.
const DefaultAudience = "onceflow"

// Config is where tokens come from, read from the environment by every
// service.
type Config struct {
	// JWKSURL serves the keys that sign the tokens, e.g. an OIDC provider's
	// jwks_uri.
	JWKSURL string `env:"AUTH_JWKS_URL"`
	// Issuer is the tokens' iss claim, exactly.
	Issuer string `env:"AUTH_ISSUER"`
	// Audience must be one of the tokens' aud values.
	Audience string `env:"AUTH_AUDIENCE" envDefault:"onceflow"`
	// Leeway is the clock skew allowed on exp, nbf and iat.
	Leeway time.Duration `env:"AUTH_LEEWAY" envDefault:"30s"`
	// RefreshInterval is how often the key set is fetched again.
	RefreshInterval time.Duration `env:"AUTH_JWKS_REFRESH" envDefault:"10m"`
	// CacheSize is how many verified tokens are remembered until they
	// expire, so that a client's next request skips the signature check;
	// 0 verifies every request.
	CacheSize int `env:"AUTH_CACHE_SIZE" envDefault:"10000"`
}

// Identity is who a verified token says the caller is.
type Identity struct {
	// Subject is the token's sub: the customer id.
	Subject string
	// Email is the token's email claim, if any, unless its email_verified
	// claim says the address is not verified (see verifiedEmail).
	Email string
	// Admin is set when the token's roles (or role) claim has "admin".
	Admin bool
	// Expires is the token's exp.
	Expires time.Time
}

// ErrInvalidToken is the error of every token Verify refuses.
var ErrInvalidToken = errors.New("invalid token")

// signingMethods are the asymmetric algorithms accepted: never "none" nor
// an HMAC, whose key would be the public key an attacker can read.
var signingMethods = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

// maxSubjectLength bounds a subject, as the API bounds every identifier.
const maxSubjectLength = 128

// MaxEmailLength bounds an e-mail address: RFC 5321's limit on a path. A
// token whose email claim is longer is refused.
const MaxEmailLength = 254

// claims are the claims a token is read into: the registered ones, the
// e-mail and whether it is verified (OIDC's email_verified: a boolean, or
// a string with some providers), and the roles, as a list ("roles") or one
// value ("role").
type claims struct {
	jwt.RegisteredClaims
	Email         string           `json:"email,omitempty"`
	EmailVerified any              `json:"email_verified,omitempty"`
	Roles         jwt.ClaimStrings `json:"roles,omitempty"`
	Role          jwt.ClaimStrings `json:"role,omitempty"`
}

// Verifier verifies tokens. It is safe for concurrent use.
type Verifier struct {
	keys   keyfunc.Keyfunc
	parser *jwt.Parser
	cache  *cache
}

// NewVerifier returns a verifier of the tokens cfg describes. It fetches
// the key set in the background until ctx ends; a key set that cannot be
// fetched yet (the provider starting after the service) is fetched again
// when a token needs it.
func NewVerifier(ctx context.Context, cfg Config, logger *slog.Logger) (*Verifier, error) {
	switch {
	case cfg.JWKSURL == "":
		return nil, errors.New("auth: AUTH_JWKS_URL is required (the dev issuer's is http://127.0.0.1:8084/.well-known/jwks.json)")
	case cfg.Issuer == "":
		return nil, errors.New("auth: AUTH_ISSUER is required")
	case cfg.Audience == "":
		return nil, errors.New("auth: AUTH_AUDIENCE is required")
	}
	keys, err := keyfunc.NewDefaultOverrideCtx(ctx, []string{cfg.JWKSURL}, keyfunc.Override{
		Client:          &http.Client{Timeout: 10 * time.Second},
		RefreshInterval: cmp.Or(cfg.RefreshInterval, 10*time.Minute),
		RefreshErrorHandlerFunc: func(u string) func(context.Context, error) {
			return func(ctx context.Context, err error) {
				logger.WarnContext(ctx, "refresh the token keys", "url", u, "err", err)
			}
		},
		// A token with an unknown key id fetches the set again (a rotation),
		// at most every 30s. The bound covers the wait for the limiter and
		// the fetch: a token that would wait longer fails at once instead
		// of holding its request, so that made-up key ids cannot.
		RefreshUnknownKID: rate.NewLimiter(rate.Every(30*time.Second), 1),
		RateLimitWaitMax:  2 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("auth: key set %s: %w", cfg.JWKSURL, err)
	}
	return &Verifier{
		keys:  keys,
		cache: newCache(cfg.CacheSize),
		parser: jwt.NewParser(
			jwt.WithValidMethods(signingMethods),
			jwt.WithIssuer(cfg.Issuer),
			jwt.WithAudience(cfg.Audience),
			jwt.WithLeeway(cfg.Leeway),
			jwt.WithExpirationRequired(),
			jwt.WithIssuedAt(),
		),
	}, nil
}

// Verify checks token and returns whom it identifies. Every refusal wraps
// ErrInvalidToken, with the reason.
func (v *Verifier) Verify(ctx context.Context, token string) (Identity, error) {
	now := time.Now()
	if id, ok := v.cache.get(token, now); ok {
		return id, nil
	}
	id, err := v.verify(ctx, token)
	if err != nil {
		return Identity{}, err
	}
	v.cache.put(token, id)
	return id, nil
}

// verify is Verify without the cache.
func (v *Verifier) verify(ctx context.Context, token string) (Identity, error) {
	var c claims
	if _, err := v.parser.ParseWithClaims(token, &c, v.keys.KeyfuncCtx(ctx)); err != nil {
		return Identity{}, fmt.Errorf("%w: %w", ErrInvalidToken, err)
	}
	if c.Subject == "" || len(c.Subject) > maxSubjectLength {
		return Identity{}, fmt.Errorf("%w: sub must be 1 to %d characters", ErrInvalidToken, maxSubjectLength)
	}
	if len(c.Email) > MaxEmailLength {
		return Identity{}, fmt.Errorf("%w: email must be at most %d characters", ErrInvalidToken, MaxEmailLength)
	}
	return Identity{
		Subject: c.Subject,
		Email:   verifiedEmail(c),
		Admin:   slices.Contains(c.Roles, RoleAdmin) || slices.Contains(c.Role, RoleAdmin),
		Expires: c.ExpiresAt.Time,
	}, nil
}

// verifiedEmail is c's e-mail, unless c says it is not verified: an
// email_verified of false (or "false", or anything but true) makes it no
// address of the caller's. A token without email_verified keeps its
// e-mail, as access tokens with an e-mail often carry no such claim: a
// provider that issues tokens for unverified addresses must say so.
func verifiedEmail(c claims) string {
	switch c.EmailVerified {
	case nil, true, "true":
		return c.Email
	}
	return ""
}
