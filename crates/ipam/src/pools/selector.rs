//! A core `NodeSelector` (a pool's `spec.nodeSelector`) matched against a node, with the
//! Kubernetes semantics: terms are ORed, a term's requirements ANDed; a term with no requirement
//! selects no node; `matchFields` knows `metadata.name` only; `Gt` and `Lt` compare integers.

use std::collections::BTreeMap;

use serde_json::Value;

/// Whether `selector` (none: every node) selects the node `name` with `labels`. A selector that
/// does not parse selects nothing: a pool whose placement cannot be read is no pool of this node.
pub fn selects(selector: Option<&Value>, name: &str, labels: &BTreeMap<String, String>) -> bool {
    let Some(selector) = selector else { return true };
    let Some(terms) = selector.get("nodeSelectorTerms").and_then(Value::as_array) else { return false };
    terms.iter().any(|term| term_selects(term, name, labels))
}

fn term_selects(term: &Value, name: &str, labels: &BTreeMap<String, String>) -> bool {
    let list = |k: &str| term.get(k).and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
    let (exprs, fields) = (list("matchExpressions"), list("matchFields"));
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs.iter().all(|r| requirement_holds(r, |key| labels.get(key).map(String::as_str)))
        && fields.iter().all(|r| requirement_holds(r, |key| (key == "metadata.name").then_some(name)))
}

fn requirement_holds<'a>(r: &Value, value_of: impl Fn(&str) -> Option<&'a str>) -> bool {
    let Some(key) = r.get("key").and_then(Value::as_str) else { return false };
    let values: Vec<&str> = r
        .get("values")
        .and_then(Value::as_array)
        .map(|v| v.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let value = value_of(key);
    let number = |s: &str| s.parse::<i64>().ok();
    match r.get("operator").and_then(Value::as_str).unwrap_or_default() {
        "In" => value.is_some_and(|v| values.contains(&v)),
        "NotIn" => !value.is_some_and(|v| values.contains(&v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" if values.len() == 1 => {
            let (Some(have), Some(bound)) = (value.and_then(number), number(values[0])) else { return false };
            if r.get("operator").and_then(Value::as_str) == Some("Gt") { have > bound } else { have < bound }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn terms_are_ored_requirements_anded_and_an_empty_term_selects_nothing() {
        let rack = json!({"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1", "r2"]},
                                  {"key": "gpu", "operator": "Exists"}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["special"]}]}]});
        assert!(selects(Some(&rack), "n1", &labels(&[("rack", "r1"), ("gpu", "h100")])));
        assert!(!selects(Some(&rack), "n1", &labels(&[("rack", "r1")])), "ANDed");
        assert!(!selects(Some(&rack), "n1", &labels(&[("rack", "r3"), ("gpu", "h100")])));
        assert!(selects(Some(&rack), "special", &labels(&[])), "ORed, by name");
        assert!(selects(None, "any", &labels(&[])), "no selector: every node");
        assert!(!selects(Some(&json!({"nodeSelectorTerms": [{}]})), "n1", &labels(&[("a", "b")])));
        assert!(!selects(Some(&json!({"nodeSelectorTerms": []})), "n1", &labels(&[])));
        assert!(!selects(Some(&json!("garbage")), "n1", &labels(&[])));
    }

    #[test]
    fn not_in_does_not_exist_gt_and_lt_follow_kubernetes() {
        let term = |r: Value| json!({"nodeSelectorTerms": [{"matchExpressions": [r]}]});
        let l = labels(&[("rail-group", "2"), ("zone", "a")]);
        assert!(selects(Some(&term(json!({"key": "zone", "operator": "NotIn", "values": ["b"]}))), "n", &l));
        assert!(selects(Some(&term(json!({"key": "absent", "operator": "NotIn", "values": ["b"]}))), "n", &l));
        assert!(selects(Some(&term(json!({"key": "absent", "operator": "DoesNotExist"}))), "n", &l));
        assert!(selects(Some(&term(json!({"key": "rail-group", "operator": "Gt", "values": ["1"]}))), "n", &l));
        assert!(!selects(Some(&term(json!({"key": "rail-group", "operator": "Lt", "values": ["2"]}))), "n", &l));
        assert!(!selects(Some(&term(json!({"key": "zone", "operator": "Gt", "values": ["1"]}))), "n", &l));
        assert!(!selects(Some(&term(json!({"key": "zone", "operator": "Sideways", "values": ["a"]}))), "n", &l));
    }
}
