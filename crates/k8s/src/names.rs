//! Kubernetes names, checked before they become part of a request: a namespace is a DNS-1123
//! label, an object's name a DNS-1123 subdomain. Names reach plexus from tenants (a claim's
//! `network`, a selection, `CNI_ARGS`, an IPPool's entries); one that is not a name (`..`, `/`,
//! `?watch=1`) must never reach an API server's URL. Every path [`crate::api::ApiClient`] requests
//! is an [`ApiPath`], which only checked names make.

use crate::error::K8sError;

/// A DNS-1123 label: what namespaces (and NAD names in a selection) must be.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// A DNS-1123 subdomain: what the names of most objects (pods, NADs, claims) must be.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// `value` as a namespace, or code 7 naming it.
pub fn namespace(value: &str) -> Result<&str, K8sError> {
    if is_dns_label(value) {
        return Ok(value);
    }
    Err(K8sError::Config(format!("namespace {value:?} is not a Kubernetes namespace name (a DNS-1123 label)")))
}

/// `value` as the name of a `kind` object, or code 7 naming it.
pub fn object<'a>(kind: &str, value: &'a str) -> Result<&'a str, K8sError> {
    if is_dns_subdomain(value) {
        return Ok(value);
    }
    Err(K8sError::Config(format!("{kind} name {value:?} is not a Kubernetes object name (a DNS-1123 subdomain)")))
}

/// A path on the API server: made only of the caller's constants (the group's prefix, the
/// resource, a subresource, a query's keys) and names checked by [`namespace`] and [`object`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiPath(String);

impl ApiPath {
    /// The collection `{prefix}/namespaces/{namespace}/{resource}` (`/api/v1`, `pods`).
    pub fn collection(prefix: &'static str, namespace_: &str, resource: &'static str) -> Result<ApiPath, K8sError> {
        Ok(ApiPath(format!("{prefix}/namespaces/{}/{resource}", namespace(namespace_)?)))
    }

    /// The object `name` of the collection (its `kind` names it in an error).
    pub fn object(
        prefix: &'static str,
        namespace_: &str,
        resource: &'static str,
        kind: &str,
        name: &str,
    ) -> Result<ApiPath, K8sError> {
        let mut p = ApiPath::collection(prefix, namespace_, resource)?;
        p.0.push('/');
        p.0.push_str(object(kind, name)?);
        Ok(p)
    }

    /// The cluster-scoped collection `{prefix}/{resource}` (`/api/v1`, `nodes`).
    pub fn cluster_collection(prefix: &'static str, resource: &'static str) -> ApiPath {
        ApiPath(format!("{prefix}/{resource}"))
    }

    /// The cluster-scoped object `name` of `{prefix}/{resource}` (`/api/v1`, `nodes`).
    pub fn cluster_object(
        prefix: &'static str,
        resource: &'static str,
        kind: &str,
        name: &str,
    ) -> Result<ApiPath, K8sError> {
        Ok(ApiPath(format!("{prefix}/{resource}/{}", object(kind, name)?)))
    }

    /// The object's subresource (`status`).
    pub fn subresource(mut self, sub: &'static str) -> ApiPath {
        self.0.push('/');
        self.0.push_str(sub);
        self
    }

    /// With the query parameter `key=value` (`value` percent-encoded but for unreserved bytes).
    pub fn query(mut self, key: &'static str, value: impl std::fmt::Display) -> ApiPath {
        self.0.push(if self.0.contains('?') { '&' } else { '?' });
        self.0.push_str(key);
        self.0.push('=');
        for b in value.to_string().bytes() {
            match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => self.0.push(char::from(b)),
                _ => self.0.push_str(&format!("%{b:02X}")),
            }
        }
        self
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ApiPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_not_a_name_never_makes_a_path() {
        for bad in ["..", "a/../b", "x?watch=1", "", "A", "-a", "a-", "a..b", &"a".repeat(254)] {
            assert!(ApiPath::object("/api/v1", "ns", "pods", "pod", bad).is_err(), "{bad:?}");
            assert!(ApiPath::collection("/api/v1", bad, "pods").is_err(), "{bad:?}");
        }
        assert!(ApiPath::collection("/api/v1", "a.b", "pods").is_err(), "a namespace is a label");
        let e =
            ApiPath::object("/apis/k8s.cni.cncf.io/v1", "team-a", "network-attachment-definitions", "NAD", "x?watch=1");
        assert_eq!(
            e.unwrap_err().to_string(),
            "NAD name \"x?watch=1\" is not a Kubernetes object name (a DNS-1123 subdomain)"
        );
    }

    #[test]
    fn names_make_the_path_their_kind_has() {
        let p = ApiPath::object("/apis/resource.k8s.io/v1", "team-a", "resourceclaims", "claim", "gpu.rail-0").unwrap();
        assert_eq!(p.as_str(), "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/gpu.rail-0");
        let p = p.subresource("status").query("fieldManager", "plexus.dev").query("force", true);
        assert_eq!(
            p.as_str(),
            "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/gpu.rail-0/status?fieldManager=plexus.dev&force=true"
        );
        assert_eq!(
            ApiPath::collection("/api/v1", "x", "pods").unwrap().query("q", "a b&c").as_str(),
            "/api/v1/namespaces/x/pods?q=a%20b%26c"
        );
    }
}
