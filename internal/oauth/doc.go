// Package oauth keeps ChatGPT accounts usable by themselves: it refreshes
// their access tokens before they expire and once after an upstream 401
// (Refresher), reads Codex's auth.json (ParseAuthJSON), runs the ChatGPT
// device-code login (DeviceLogin), and polls the usage endpoint and brings
// limited accounts back at their reset time (UsagePoller, Recover).
//
// # Token refresh
//
// ChatGPT refresh tokens rotate: each one works once, and the answer carries
// the next one. A relay that loses the rotated token, or spends one twice,
// loses the account. So a refresh is single-flight per account: in-process,
// concurrent callers wait for one refresh; across replicas, a database claim
// (store.ClaimRefresh, a compare-and-set row with an expiry) lets one replica
// refresh while the others wait and re-read what it committed. The rotated
// refresh token is committed (sealed, with the new access token and its
// expiry, in one write) before the new access token is handed to anyone.
//
// A refresh the auth server rejects (400 or 401: invalid_grant,
// refresh_token_reused, refresh_token_expired, ...) marks the account
// reauth_required with a reason naming the error; a transport error or a
// 5xx leaves the account as it is. Nothing this package logs or returns as
// an error contains a token.
//
// # Wire shapes
//
// The endpoints and payloads follow the Codex CLI (codex-rs/login):
//
//	refresh:     POST {auth}/oauth/token  {"client_id","grant_type":"refresh_token","refresh_token"}
//	             -> {"id_token"?,"access_token"?,"refresh_token"?,"expires_in"?}
//	device code: POST {auth}/api/accounts/deviceauth/usercode {"client_id"}
//	             -> {"device_auth_id","user_code","interval":"5"}
//	             POST {auth}/api/accounts/deviceauth/token {"device_auth_id","user_code"}
//	             -> 403/404 while pending; 200 {"authorization_code","code_challenge","code_verifier"}
//	             POST {auth}/oauth/token grant_type=authorization_code&code&redirect_uri={auth}/deviceauth/callback&client_id&code_verifier
//	             the user opens {auth}/codex/device and enters the user code
//	usage:       GET https://chatgpt.com/backend-api/wham/usage (Authorization, ChatGPT-Account-Id)
package oauth
