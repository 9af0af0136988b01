// The client kit imports "pusher-js" (index.html maps that name here): in the page it is
// the vendored browser build, loaded as a classic script before the modules run.
export default window.Pusher;
