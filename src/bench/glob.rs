//! Path globs of fault rules (`--path`), compiled once when the rule is
//! added, never per request.
//!
//! Paths are matched relative to the mount, without a leading `/`: `*`
//! and `?` match within one name, `**` any number of whole names (also
//! none), `[abc]`, `[a-z]` and `[!a-z]` one character of a name; `\`
//! quotes the next character.

/// One step of a compiled glob.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(char),
    /// `?`: one character other than `/`.
    One,
    /// `*`: any run of characters other than `/`.
    Star,
    /// `**/` (or a final `**`): any number of whole names.
    Names,
    /// `[...]`: one character (not `/`) in (or, negated, not in) the ranges.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

/// A compiled glob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    source: String,
    tokens: Vec<Token>,
    /// The literal start, before any wildcard: a path without it is
    /// refused before any matching (most paths most rules never match).
    prefix: String,
}

impl Glob {
    /// Compile `pattern`; a pattern that does not parse (an unclosed
    /// `[`, a trailing `\`, an empty class) is refused with the reason.
    pub fn new(pattern: &str) -> Result<Glob, String> {
        let p: Vec<char> = pattern.trim_start_matches('/').chars().collect();
        let mut tokens = Vec::new();
        let mut i = 0;
        while i < p.len() {
            match p[i] {
                '\\' => {
                    let c = *p.get(i + 1).ok_or_else(|| format!("glob {pattern:?} ends with a lone \\"))?;
                    tokens.push(Token::Literal(c));
                    i += 2;
                }
                '?' => {
                    tokens.push(Token::One);
                    i += 1;
                }
                '*' if p.get(i + 1) == Some(&'*') => {
                    // `**` stands for whole names only: at the start or
                    // after a `/`, and followed by `/` or the end.
                    let whole = (i == 0 || p[i - 1] == '/') && matches!(p.get(i + 2), None | Some('/'));
                    if !whole {
                        return Err(format!("glob {pattern:?}: ** must be a whole name (a/**/b)"));
                    }
                    tokens.push(Token::Names);
                    i += if p.get(i + 2) == Some(&'/') { 3 } else { 2 };
                }
                '*' => {
                    tokens.push(Token::Star);
                    i += 1;
                }
                '[' => {
                    let mut j = i + 1;
                    let negated = matches!(p.get(j), Some('!') | Some('^'));
                    if negated {
                        j += 1;
                    }
                    let mut ranges = Vec::new();
                    let mut first = true;
                    loop {
                        let c = *p.get(j).ok_or_else(|| format!("glob {pattern:?}: [ is never closed"))?;
                        if c == ']' && !first {
                            break;
                        }
                        first = false;
                        if p.get(j + 1) == Some(&'-') && p.get(j + 2).is_some_and(|e| *e != ']') {
                            let end = p[j + 2];
                            if end < c {
                                return Err(format!("glob {pattern:?}: range {c}-{end} is backwards"));
                            }
                            ranges.push((c, end));
                            j += 3;
                        } else {
                            ranges.push((c, c));
                            j += 1;
                        }
                    }
                    tokens.push(Token::Class { negated, ranges });
                    i = j + 1;
                }
                c => {
                    tokens.push(Token::Literal(c));
                    i += 1;
                }
            }
        }
        let prefix = tokens
            .iter()
            .map_while(|t| match t {
                Token::Literal(c) => Some(*c),
                _ => None,
            })
            .collect();
        Ok(Glob { source: pattern.to_string(), tokens, prefix })
    }

    /// The literal start of the pattern, before any wildcard.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The pattern as given.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether the mount-relative `path` (with or without a leading `/`)
    /// matches.
    pub fn matches(&self, path: &str) -> bool {
        let path = path.trim_start_matches('/');
        if !path.starts_with(&self.prefix) {
            return false;
        }
        let s: Vec<char> = path.chars().collect();
        Self::at(&self.tokens, &s)
    }

    fn at(t: &[Token], s: &[char]) -> bool {
        let Some((first, rest)) = t.split_first() else { return s.is_empty() };
        match first {
            Token::Literal(c) => s.first() == Some(c) && Self::at(rest, &s[1..]),
            Token::One => s.first().is_some_and(|c| *c != '/') && Self::at(rest, &s[1..]),
            Token::Class { negated, ranges } => s.first().is_some_and(|c| {
                *c != '/' && ranges.iter().any(|(a, b)| a <= c && c <= b) != *negated && Self::at(rest, &s[1..])
            }),
            Token::Star => {
                // Any run within the current name.
                let name_end = s.iter().position(|c| *c == '/').unwrap_or(s.len());
                (0..=name_end).any(|k| Self::at(rest, &s[k..]))
            }
            Token::Names => {
                // None, or whole names: after each `/` (or the end).
                if Self::at(rest, s) {
                    return true;
                }
                s.iter().enumerate().filter(|(_, c)| **c == '/').any(|(k, _)| Self::at(rest, &s[k + 1..]))
                    || rest.is_empty()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Glob;

    fn m(p: &str, s: &str) -> bool {
        Glob::new(p).unwrap().matches(s)
    }

    #[test]
    fn globs_match_as_shells_and_fnmatch_with_pathname_do() {
        assert!(m("wal/*", "wal/000001.log"));
        assert!(m("/wal/*", "/wal/x"));
        assert!(!m("wal/*", "wal/a/b"));
        assert!(!m("wal/*", "wal"));
        assert!(m("*.db", "app.db"));
        assert!(!m("*.db", "dir/app.db"));
        assert!(m("**/*.db", "app.db"));
        assert!(m("**/*.db", "a/b/app.db"));
        assert!(m("data/**", "data/x/y"));
        assert!(m("data/**", "data/x"));
        assert!(m("a/**/b", "a/b"));
        assert!(m("a/**/b", "a/x/y/b"));
        assert!(!m("a/**/b", "a/x/yb"));
        assert!(m("f?", "f1"));
        assert!(!m("f?", "f/"));
        assert!(m("x[0-9]", "x7"));
        assert!(!m("x[!0-9]", "x7"));
        assert!(m("x[!0-9]", "xa"));
        assert!(m("x[]]", "x]"));
        assert!(m("a\\*", "a*"));
        assert!(!m("a\\*", "ab"));
        assert!(m("*", "anything"));
        assert!(m("", ""));
    }

    #[test]
    fn globs_that_do_not_parse_are_refused_with_the_reason() {
        for bad in ["x[ab", "a\\", "a**", "**b", "x[z-a]"] {
            let e = Glob::new(bad).unwrap_err();
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }
}
