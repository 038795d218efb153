"""Single sign-on with OpenID Connect (mozilla-django-oidc), off unless ``OIDC_ENABLED=true``:

* `backend`: the authentication backend (ID token checks, finding or linking the account, staff and team
  memberships from the provider's groups) and `sso_config`;
* `views`: the /oidc/ login and callback views, the logout that also ends the provider's session;
* `emails`: the pure first-login email rule (which local account an identity may take over).

The settings themselves are read in `efficiency.sso_config`. Nothing is re-exported here: import the
module that defines a name.
"""
